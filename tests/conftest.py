"""Shared fixtures: a real fake upstream and real memrelay servers on loopback ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from proxy.app import create_app
from proxy.settings import Settings
from tests.fake_upstream import FakeUpstream
from tests.servers import ServedApp


@pytest.fixture(scope="session")
def served_fake() -> Iterator[tuple[FakeUpstream, ServedApp]]:
    fake = FakeUpstream()
    with ServedApp(fake) as served:
        yield fake, served


@pytest.fixture
def fake(served_fake: tuple[FakeUpstream, ServedApp]) -> FakeUpstream:
    fake, _ = served_fake
    fake.reset()
    return fake


@pytest.fixture
def fake_url(served_fake: tuple[FakeUpstream, ServedApp]) -> str:
    return served_fake[1].url


@pytest.fixture
def make_proxy(fake_url: str) -> Iterator[Callable[..., ServedApp]]:
    """Start memrelay in front of the fake upstream; keyword arguments become settings."""
    started: list[ServedApp] = []

    def start(interceptors: list[Any] | None = None, **overrides: Any) -> ServedApp:
        overrides.setdefault("upstream_url", fake_url + "/v1")
        settings = Settings(**overrides)
        served = ServedApp(create_app(settings, interceptors=interceptors))
        served.__enter__()
        started.append(served)
        return served

    yield start
    for served in started:
        served.__exit__(None, None, None)


@pytest.fixture
def proxy(make_proxy: Callable[..., ServedApp]) -> ServedApp:
    return make_proxy()


@pytest.fixture(scope="session")
def embedder() -> Any:
    """The real all-MiniLM-L6-v2 int8 model, loaded once per test session."""
    from memory_core import FastEmbedEmbedder

    model = FastEmbedEmbedder()
    model.embed(["warm up"])
    return model


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """One real PostgreSQL 18 + pgvector server per test session (started on first use)."""
    from tests.postgres import EmbeddedPostgres

    server = EmbeddedPostgres()
    yield server
    server.stop()


BACKENDS = ["vector-cache", "vec0-knn", "postgres"]


def open_backend(kind: str, location: Any, embedder: Any, loop: Any) -> Any:
    """Open a store of `kind` ('postgres' or a SQLite flavour) at `location`."""
    from memory_core import SQLiteStore
    from memory_core.postgres.store import PostgresStore

    if kind == "postgres":
        opened = loop.run_until_complete(PostgresStore.open(location, embedder))
    else:
        opened = loop.run_until_complete(
            SQLiteStore.open(location, embedder, vector_cache=kind == "vector-cache")
        )
    opened.loop = loop  # tests call `run(store.op(...))` through this loop
    opened.backend = kind
    opened.location = location
    return opened


@pytest.fixture(params=BACKENDS)
def store(request: Any, tmp_path: Any, embedder: Any) -> Iterator[Any]:
    """A real store driven from a private event loop, once per backend: SQLite with KNN
    from the in-memory vector cache, SQLite with vec0 KNN, and Postgres + pgvector."""
    import asyncio

    loop = asyncio.new_event_loop()
    if request.param == "postgres":
        location = request.getfixturevalue("pg_server").new_database()
    else:
        location = tmp_path / "memory.db"
    opened = open_backend(request.param, location, embedder, loop)
    yield opened
    loop.run_until_complete(opened.close())
    loop.close()


@pytest.fixture
def other_store(request: Any, store: Any, tmp_path: Any, embedder: Any) -> Iterator[Any]:
    """Opens another store of the same backend: on the same database (`same=True`, as a
    second replica or the CLI would) or on a new empty one."""
    opened: list[Any] = []

    def open_other(same: bool, model: Any = None) -> Any:
        if same:
            location = store.location
        elif store.backend == "postgres":
            location = request.getfixturevalue("pg_server").new_database()
        else:
            location = tmp_path / f"other{len(opened)}.db"
        other = open_backend(store.backend, location, model or embedder, store.loop)
        opened.append(other)
        return other

    yield open_other
    for other in opened:
        store.loop.run_until_complete(other.close())


@pytest.fixture
def run(store: Any) -> Callable[[Any], Any]:
    return store.loop.run_until_complete


class SeedStore:
    """A second store on the proxy's database file, for tests to write memories with.

    The proxy's own store sees these writes through the event feed, as it would see
    writes made by the CLI.
    """

    def __init__(self, path: Any, embedder: Any) -> None:
        import asyncio

        from memory_core import SQLiteStore

        self.loop = asyncio.new_event_loop()
        self.store = self.loop.run_until_complete(SQLiteStore.open(path, embedder))

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def add(self, tenant: str, space: str, content: str, **fields: Any) -> Any:
        from memory_core import NewMemory

        return self.run(self.store.add(tenant, space, NewMemory(content, **fields)))

    def close(self) -> None:
        self.run(self.store.close())
        self.loop.close()


@pytest.fixture
def memory_proxy(tmp_path: Any, embedder: Any, fake_url: str) -> Iterator[Callable[..., Any]]:
    """Start memrelay with real recall over a real SQLite file; returns (server, seed)."""
    from memory_core import SQLiteStore
    from proxy.wiring import build_app

    servers: list[ServedApp] = []
    seeds: list[SeedStore] = []

    def start(store_class: Any = SQLiteStore, **overrides: Any) -> tuple[ServedApp, SeedStore]:
        overrides.setdefault("upstream_url", fake_url)
        overrides.setdefault("db", tmp_path / f"memory{len(servers)}.db")
        overrides.setdefault("recall_min_similarity", -1.0)
        overrides.setdefault("extraction_workers", 0)  # jobs wait in the queue unless asked
        # What is injected must not depend on how loaded the machine is; tests of the
        # budget itself pass their own.
        overrides.setdefault("recall_budget_ms", 5000)
        settings = Settings(**overrides)
        served = ServedApp(build_app(settings, store=store_class(settings.db, embedder)))
        served.__enter__()
        servers.append(served)
        seeds.append(SeedStore(settings.db, embedder))
        return served, seeds[-1]

    yield start
    for served in servers:
        served.__exit__(None, None, None)
    for seed in seeds:
        seed.close()
