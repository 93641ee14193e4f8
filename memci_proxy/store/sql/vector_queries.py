"""Page embeddings in PostgreSQL (pgvector): store, look up what is stored, nearest pages of one conversation.

Vectors are bound as text ('[0.1,0.2,...]') and cast to ``vector`` in SQL, so no driver codec is needed.

Nearest-page search is scoped to one conversation (and tenant). It is an exact scan of that conversation's
vectors (the primary key's ``conversation_id`` prefix finds them; cosine distance is computed for each):
a conversation holds at most some thousands of pages, which pgvector ranks in milliseconds. The HNSW
expression index (``ensure_vector_index``) serves ``ORDER BY embedding::vector(dim) <=> q`` over the whole
table; with a per-conversation filter, pgvector before 0.8 filters *after* the index scan (``hnsw.ef_search``
candidates, 40 by default), which would return fewer than k pages whenever the conversation is a small part
of the table. ``exact=False`` asks for the indexed plan (with pgvector >= 0.8 and ``hnsw.iterative_scan``
it keeps scanning until k pages of the conversation are found).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from sqlalchemy import bindparam, text
from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("memci.store")

_OWNED = text("SELECT 1 FROM conversations WHERE id = :conversation_id AND tenant = :tenant FOR SHARE")

_UPSERT = text(
    "INSERT INTO memory_vectors (conversation_id, number, model, dim, digest, embedding) "
    "VALUES (:conversation_id, :number, :model, :dim, :digest, CAST(CAST(:embedding AS text) AS vector)) "
    "ON CONFLICT (conversation_id, number, model) DO UPDATE SET "
    "dim = EXCLUDED.dim, digest = EXCLUDED.digest, embedding = EXCLUDED.embedding, created_at = now()"
)

_DIGESTS = text(
    "SELECT v.number, v.digest FROM memory_vectors v JOIN conversations c ON c.id = v.conversation_id "
    "WHERE v.conversation_id = :conversation_id AND c.tenant = :tenant AND v.model = :model"
)

_DELETE = text(
    "DELETE FROM memory_vectors v USING conversations c "
    "WHERE c.id = v.conversation_id AND c.tenant = :tenant AND v.conversation_id = :conversation_id "
    "AND v.number = ANY(:numbers)"
).bindparams(bindparam("numbers"))


def vector_literal(vector: Sequence[float]) -> str:
    """pgvector's text form; rejects what pgvector would (NaN, infinities, empty)."""
    if not vector:
        raise ValueError("an empty vector cannot be stored")
    parts = []
    for x in vector:
        value = float(x)
        if not math.isfinite(value):
            raise ValueError("vector elements must be finite")
        parts.append(repr(value))
    return "[" + ",".join(parts) + "]"


def _nearest_sql(dim: int, exact: bool) -> str:
    # Exact: the distance expression does not match the HNSW index's, so the planner scans the conversation.
    column = "v.embedding" if exact else f"(v.embedding::vector({dim}))"
    # A scalar subquery: the text is parsed once (an InitPlan), not once per row as a cast of a parameter would be.
    target = "vector" if exact else f"vector({dim})"
    query = f"(SELECT CAST(CAST(:query AS text) AS {target}))"
    order = "distance, v.number" if exact else "distance"  # an HNSW scan orders by the distance alone
    return (
        f"SELECT v.number, {column} <=> {query} AS distance FROM memory_vectors v "
        f"WHERE v.conversation_id = :conversation_id AND v.model = :model AND v.dim = {dim} "
        f"AND EXISTS (SELECT 1 FROM conversations c WHERE c.id = :conversation_id AND c.tenant = :tenant) "
        f"ORDER BY {order} LIMIT :k"
    )


class PageVectorQueries:
    """Mixed into SqlConversationRepository (implements memci_proxy.store.ports.PageVectorStore)."""

    engine: AsyncEngine

    async def put_page_vectors(
        self, tenant: str, conversation_id: str, model: str, vectors: Sequence[tuple[str, str, Sequence[float]]]
    ) -> int:
        """Store (page number, digest of the embedded text, vector) rows; replaces a page's previous vector
        of that model. Returns rows written (0 when the conversation is not this tenant's)."""
        if not vectors:
            return 0
        params = [
            {
                "conversation_id": conversation_id,
                "number": number,
                "model": model,
                "dim": len(vector),
                "digest": digest,
                "embedding": vector_literal(vector),
            }
            for number, digest, vector in vectors
        ]
        async with self.engine.begin() as connection:
            # The conversation row is locked (shared) for the transaction: it cannot be deleted in between.
            owned = (await connection.execute(_OWNED, {"tenant": tenant, "conversation_id": conversation_id})).first()
            if owned is None:
                return 0
            await connection.execute(_UPSERT, params)  # executemany
        return len(params)

    async def page_vector_digests(self, tenant: str, conversation_id: str, model: str) -> dict[str, str]:
        """Page number -> digest of the text whose vector is stored for ``model``."""
        async with self.engine.connect() as connection:
            rows = (
                await connection.execute(
                    _DIGESTS, {"tenant": tenant, "conversation_id": conversation_id, "model": model}
                )
            ).all()
        return {r.number: r.digest for r in rows}

    async def delete_page_vectors(self, tenant: str, conversation_id: str, numbers: Sequence[str]) -> int:
        if not numbers:
            return 0
        async with self.engine.begin() as connection:
            result = await connection.execute(
                _DELETE, {"tenant": tenant, "conversation_id": conversation_id, "numbers": list(numbers)}
            )
        return result.rowcount or 0

    async def nearest_pages(
        self,
        tenant: str,
        conversation_id: str,
        model: str,
        query: Sequence[float],
        k: int = 10,
        exact: bool = True,
    ) -> list[tuple[str, float]]:
        """The ``k`` pages of the conversation nearest to ``query`` by cosine: ``(number, cosine similarity)``,
        best first. Only vectors of ``model`` and of the query's dimension take part."""
        if k <= 0:
            return []
        dim = len(query)
        params = {
            "tenant": tenant,
            "conversation_id": conversation_id,
            "model": model,
            "query": vector_literal(query),
            "k": int(k),
        }
        async with self.engine.connect() as connection:
            rows = (await connection.execute(text(_nearest_sql(dim, exact)), params)).all()
        return [
            (r.number, 1.0 - float(r.distance)) for r in rows if r.distance is not None and not math.isnan(r.distance)
        ]

    async def ensure_vector_index(self, dim: int) -> str:
        """Create the HNSW cosine index of dimension ``dim`` when missing; returns its name.

        ``CREATE INDEX CONCURRENTLY`` (no write lock on the table) runs outside a transaction; a failed
        concurrent build leaves an invalid index, which is dropped and built again."""
        if not 1 <= dim <= 2000:  # pgvector indexes vectors of up to 2,000 dimensions
            raise ValueError(f"no HNSW index for dimension {dim} (1..2000)")
        name = f"ix_memory_vectors_hnsw_{int(dim)}"
        autocommit = await self.engine.connect()
        try:
            connection = await autocommit.execution_options(isolation_level="AUTOCOMMIT")
            valid = (
                await connection.execute(
                    text(
                        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                        "WHERE c.relname = :name"
                    ),
                    {"name": name},
                )
            ).scalar_one_or_none()
            if valid is True:
                return name
            if valid is False:
                await connection.execute(text(f"DROP INDEX CONCURRENTLY IF EXISTS {name}"))
            await connection.execute(
                text(
                    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON memory_vectors "
                    f"USING hnsw ((embedding::vector({int(dim)})) vector_cosine_ops) WHERE dim = {int(dim)}"
                )
            )
            log.info("HNSW index %s ready", name)
            return name
        finally:
            await autocommit.close()
