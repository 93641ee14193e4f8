"""Open the store the settings ask for: external or embedded PostgreSQL, Redis or in-process hot state."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine

from memci_proxy.settings import Settings
from memci_proxy.store.hot.memory import InProcessHotState
from memci_proxy.store.hot.redis import RedisHotState
from memci_proxy.store.hot.resilient import ResilientHotState
from memci_proxy.store.ports import BlobOwnership, ConversationRepository, HotState, ResponseChains
from memci_proxy.store.sql.blob_queries import SqlBlobOwnership
from memci_proxy.store.sql.embedded import EmbeddedPostgres, start_embedded_postgres
from memci_proxy.store.sql.migrate import run_migrations
from memci_proxy.store.sql.response_chains import SqlResponseChains
from memci_proxy.store.sql.repository import SqlConversationRepository, create_engine_from_url
from memci_proxy.store.sql.urls import redact, to_async_url

logger = logging.getLogger("memci.store")


@dataclass
class Store:
    repo: ConversationRepository
    hot: HotState
    kind_db: str  # "embedded" | "external"
    kind_hot: str  # "redis" | "in-process"
    database_url: str  # asyncpg SQLAlchemy URL
    engine: AsyncEngine | None = None
    embedded: EmbeddedPostgres | None = field(default=None, repr=False)
    write_engine: AsyncEngine | None = None  # the connections turns are written on
    read_engine: AsyncEngine | None = None  # those of the reads on the driver's connection
    owners: BlobOwnership | None = None  # who sent which image bytes (tenant walls for blobs)
    chains: ResponseChains | None = None  # the messages behind previous_response_id

    async def close(self) -> None:
        await self.hot.close()
        if self.engine is not None:
            await self.engine.dispose()
        for engine in (self.write_engine, self.read_engine):
            if engine is not None:
                await engine.dispose()
        if self.embedded is not None:
            await asyncio.to_thread(self.embedded.stop)


async def open_store(settings: Settings, migrate: bool = True) -> Store:
    """Start what is missing and connect.

    No DATABASE_URL: an embedded PostgreSQL under ``settings.home_path / "pg"``. No REDIS_URL:
    in-process hot state (one replica only). Redis is used through ResilientHotState, which falls
    back to in-process state while Redis is unreachable. ``migrate``: bring the schema to the newest revision
    first (safe with several replicas starting at once: migrations take an advisory lock).
    """
    embedded: EmbeddedPostgres | None = None
    if settings.database_url:
        database_url, kind_db = to_async_url(settings.database_url), "external"
    else:
        embedded = await asyncio.to_thread(start_embedded_postgres, settings.home_path / "pg")
        database_url, kind_db = embedded.async_url, "embedded"
    try:
        if migrate:
            await asyncio.to_thread(run_migrations, database_url)
        fulltext = settings.page_fulltext
        engine = create_engine_from_url(database_url, fulltext=fulltext)
        write_engine = create_engine_from_url(database_url, pool_size=4, max_overflow=4, pre_ping=False,
                                              fulltext=fulltext)
        read_engine = create_engine_from_url(database_url, pool_size=4, max_overflow=8, pre_ping=False,
                                             fulltext=fulltext)
    except BaseException:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
        raise
    logger.info("store of truth: %s PostgreSQL %s", kind_db, redact(database_url))

    hot: HotState
    if settings.redis_url:
        fallback = InProcessHotState(max_snapshot_bytes=settings.hot_state_max_mb * 2**20)
        hot, kind_hot = ResilientHotState(RedisHotState(settings.redis_url), fallback), "redis"
        reachable = await hot.ping()
        logger.log(
            logging.INFO if reachable else logging.WARNING,
            "hot state and session locks: Redis %s%s",
            settings.redis_url.split("@")[-1],
            "" if reachable else " (unreachable now: in-process until it answers)",
        )
    else:
        hot, kind_hot = InProcessHotState(max_snapshot_bytes=settings.hot_state_max_mb * 2**20), "in-process"
        logger.warning("hot state and session locks: in-process (no REDIS_URL) - run one replica only")
        if settings.workers > 1:
            logger.warning(
                "%d server workers without REDIS_URL: each worker has its own session locks; "
                "concurrent requests of one conversation on two workers are caught only by the "
                "database's version check (StaleState)",
                settings.workers,
            )
    return Store(
        repo=SqlConversationRepository(engine, write_engine, read_engine),
        hot=hot,
        kind_db=kind_db,
        kind_hot=kind_hot,
        database_url=database_url,
        engine=engine,
        embedded=embedded,
        write_engine=write_engine,
        read_engine=read_engine,
        owners=SqlBlobOwnership(engine),
        chains=SqlResponseChains(engine, write_engine),
    )
