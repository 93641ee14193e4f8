"""Page vectors on the real PostgreSQL + pgvector: store, replace, nearest pages, tenant scope, HNSW index."""

from __future__ import annotations

import math

import psycopg
import pytest

from memci_proxy.store.ports import PageVectorStore
from memci_proxy.store.sql.repository import SqlConversationRepository
from memci_proxy.store.sql.urls import to_libpq_url


def _unit(*xs: float) -> list[float]:
    norm = math.sqrt(sum(x * x for x in xs))
    return [x / norm for x in xs]


async def _conversation(repo: SqlConversationRepository, tenant: str = "t1", cid: str = "c1") -> str:
    await repo.create_conversation(tenant, cid)
    return cid


async def test_repository_is_a_page_vector_store(repo: SqlConversationRepository) -> None:
    assert isinstance(repo, PageVectorStore)


async def test_nearest_pages_rank_by_cosine(repo: SqlConversationRepository) -> None:
    cid = await _conversation(repo)
    written = await repo.put_page_vectors(
        "t1", cid, "m", [("1", "d1", _unit(1, 0, 0)), ("2", "d2", _unit(1, 1, 0)), ("3", "d3", _unit(0, 0, 1))]
    )
    assert written == 3
    hits = await repo.nearest_pages("t1", cid, "m", _unit(1, 0.1, 0), k=2)
    assert [n for n, _ in hits] == ["1", "2"]
    assert hits[0][1] == pytest.approx(1 / math.sqrt(1.01), abs=1e-5)
    assert hits[0][1] > hits[1][1]
    assert len(await repo.nearest_pages("t1", cid, "m", _unit(1, 0, 0), k=10)) == 3


async def test_upsert_replaces_the_vector_and_digest(repo: SqlConversationRepository) -> None:
    cid = await _conversation(repo)
    await repo.put_page_vectors("t1", cid, "m", [("1", "old", _unit(1, 0, 0)), ("2", "x", _unit(0, 1, 0))])
    await repo.put_page_vectors("t1", cid, "m", [("1", "new", _unit(0, 0, 1))])
    assert await repo.page_vector_digests("t1", cid, "m") == {"1": "new", "2": "x"}
    hits = await repo.nearest_pages("t1", cid, "m", _unit(0, 0, 1), k=1)
    assert hits[0][0] == "1" and hits[0][1] == pytest.approx(1.0, abs=1e-6)


async def test_models_and_dimensions_are_kept_apart(repo: SqlConversationRepository) -> None:
    cid = await _conversation(repo)
    await repo.put_page_vectors("t1", cid, "small", [("1", "a", _unit(1, 0))])
    await repo.put_page_vectors("t1", cid, "big", [("1", "a", _unit(1, 0, 0, 0)), ("2", "b", _unit(0, 1, 0, 0))])
    assert [n for n, _ in await repo.nearest_pages("t1", cid, "small", _unit(1, 0), k=5)] == ["1"]
    assert len(await repo.nearest_pages("t1", cid, "big", _unit(1, 0, 0, 0), k=5)) == 2
    assert await repo.nearest_pages("t1", cid, "big", _unit(1, 0), k=5) == []  # another dimension: nothing
    assert await repo.page_vector_digests("t1", cid, "small") == {"1": "a"}


async def test_other_tenants_neither_write_nor_read(repo: SqlConversationRepository) -> None:
    cid = await _conversation(repo)
    assert await repo.put_page_vectors("t2", cid, "m", [("1", "d", _unit(1, 0))]) == 0
    await repo.put_page_vectors("t1", cid, "m", [("1", "d", _unit(1, 0))])
    assert await repo.nearest_pages("t2", cid, "m", _unit(1, 0), k=5) == []
    assert await repo.page_vector_digests("t2", cid, "m") == {}
    assert await repo.delete_page_vectors("t2", cid, ["1"]) == 0
    assert await repo.delete_page_vectors("t1", cid, ["1"]) == 1


async def test_conversation_search_is_scoped(repo: SqlConversationRepository) -> None:
    await _conversation(repo, cid="a")
    await _conversation(repo, cid="b")
    await repo.put_page_vectors("t1", "a", "m", [("1", "d", _unit(1, 0))])
    await repo.put_page_vectors("t1", "b", "m", [("1", "d", _unit(1, 0.01)), ("2", "d", _unit(0.9, 0.1))])
    assert [n for n, _ in await repo.nearest_pages("t1", "a", "m", _unit(1, 0), k=5)] == ["1"]


async def test_deleting_the_conversation_removes_its_vectors(repo: SqlConversationRepository) -> None:
    cid = await _conversation(repo)
    await repo.put_page_vectors("t1", cid, "m", [("1", "d", _unit(1, 0))])
    assert await repo.delete_conversation("t1", cid)
    await _conversation(repo)
    assert await repo.page_vector_digests("t1", cid, "m") == {}


async def test_bad_vectors_are_refused(repo: SqlConversationRepository) -> None:
    cid = await _conversation(repo)
    with pytest.raises(ValueError):
        await repo.put_page_vectors("t1", cid, "m", [("1", "d", [])])
    with pytest.raises(ValueError):
        await repo.put_page_vectors("t1", cid, "m", [("1", "d", [float("nan"), 1.0])])


async def test_hnsw_index_per_dimension_serves_the_indexed_query(
    repo: SqlConversationRepository, migrated_db_url: str
) -> None:
    cid = await _conversation(repo)
    rows = [(str(i), "d", _unit(1.0, i / 50.0, (i % 7) / 7.0)) for i in range(200)]
    await repo.put_page_vectors("t1", cid, "m", rows)
    name = await repo.ensure_vector_index(3)
    assert name == "ix_memory_vectors_hnsw_3"
    assert await repo.ensure_vector_index(3) == name  # idempotent
    with psycopg.connect(to_libpq_url(migrated_db_url)) as conn:
        definition = conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", (name,)).fetchone()[0]
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_indexscan = on")
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN SELECT number FROM memory_vectors WHERE dim = 3 "
                "ORDER BY embedding::vector(3) <=> '[1,0,0]'::vector(3) LIMIT 5"
            ).fetchall()
        )
    assert "hnsw" in definition and "vector_cosine_ops" in definition and "(dim = 3)" in definition
    assert name in plan
    approximate = await repo.nearest_pages("t1", cid, "m", _unit(1, 0, 0), k=5, exact=False)
    exact = await repo.nearest_pages("t1", cid, "m", _unit(1, 0, 0), k=5)
    assert [n for n, _ in exact][0] == "0"
    assert {n for n, _ in approximate} & {n for n, _ in exact}
    with pytest.raises(ValueError):
        await repo.ensure_vector_index(4000)
