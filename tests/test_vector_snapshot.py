"""Vector snapshots: a restart loads the same vectors a fresh load reads, events after
the snapshot are applied, stale snapshots are refused, and forget erases the vector
from the file on disk (at once, and from the rewritten file)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memory_core import NewMemory, SQLiteStore
from memory_core.sqlite import vector_cache as vector_cache_module
from memory_core.sqlite.vector_snapshot import SnapshotDir

TENANT = "acme"
SPACES = ["default", "work"]


@pytest.fixture(autouse=True)
def small_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vector_cache_module, "SNAPSHOT_FROM", 50)


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    block = rng.standard_normal((n, dim)).astype(np.float32)
    return block / np.linalg.norm(block, axis=1, keepdims=True)


class Harness:
    """Real SQLite stores on one file, driven from one private loop."""

    def __init__(self, path: Path, embedder: Any) -> None:
        self.path = path
        self.embedder = embedder
        self.loop = asyncio.new_event_loop()
        self.rng = np.random.default_rng(3)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def open(self, vector_cache: bool = True) -> SQLiteStore:
        return self.run(SQLiteStore.open(self.path, self.embedder, vector_cache=vector_cache))

    def fill(self, store: SQLiteStore, n: int, space: str = "default") -> list[Any]:
        items = [NewMemory(f"synthetic memory number {i} in {space}") for i in range(n)]
        vectors = unit(self.rng, n, self.embedder.dim)
        memories = self.run(store.add_embedded(TENANT, space, items, vectors))
        return list(zip(memories, vectors, strict=True))

    def knn(self, store: SQLiteStore, queries: np.ndarray) -> list[list[tuple[int, float]]]:
        def search(conn: Any) -> list[list[tuple[int, float]]]:
            return [
                [
                    (r, round(s, 5))
                    for r, s in store._cache.search(conn, TENANT, SPACES, None, q, 10)
                ]
                for q in queries
            ]

        return self.run(store.run_read(search))

    def cached(self, store: SQLiteStore) -> Any:
        return store._cache._tenants[TENANT]

    def close(self) -> None:
        self.loop.close()


@pytest.fixture
def harness(tmp_path: Path, embedder: Any) -> Any:
    h = Harness(tmp_path / "memory.db", embedder)
    yield h
    h.close()


def snapshot_dir(h: Harness) -> Path:
    return SnapshotDir(h.path.with_name(h.path.name + ".vectors"), "", 0).tenant_dir(TENANT)


def test_restart_from_snapshot_equals_a_fresh_load(harness):
    h = harness
    store = h.open()
    h.fill(store, 120)
    h.fill(store, 80, "work")
    queries = unit(h.rng, 15, h.embedder.dim)
    h.knn(store, queries)  # first load from the database writes the snapshot
    assert (snapshot_dir(h) / "meta.json").exists()
    h.run(store.close())

    # Changes made while no cache was watching: seen through the events after seq.
    writer = h.open(vector_cache=False)
    added = h.fill(writer, 30, "work")
    old = added[0][0]
    h.run(writer.supersede(TENANT, old.id, NewMemory("a corrected synthetic memory"), "fix"))
    h.run(writer.close())

    restarted = h.open()
    from_snapshot = h.knn(restarted, queries)
    assert h.cached(restarted).loaded_from == "snapshot"
    h.run(restarted.close())

    shutil.rmtree(snapshot_dir(h))
    fresh = h.open()
    from_database = h.knn(fresh, queries)
    assert h.cached(fresh).loaded_from == "database"
    h.run(fresh.close())
    assert from_snapshot == from_database
    assert all(len(hits) == 10 for hits in from_snapshot)


def test_a_snapshot_for_another_database_or_model_is_not_used(harness, tmp_path):
    h = harness
    store = h.open()
    h.fill(store, 100)
    queries = unit(h.rng, 5, h.embedder.dim)
    h.knn(store, queries)
    h.run(store.close())
    kept = tmp_path / "kept-snapshot"
    shutil.copytree(snapshot_dir(h), kept)

    # The database is replaced by another one with fewer events: seq is past its head.
    for suffix in ("", "-wal", "-shm"):
        Path(str(h.path) + suffix).unlink(missing_ok=True)
    store = h.open()
    h.fill(store, 10)
    got = h.knn(store, queries)
    assert h.cached(store).loaded_from == "database"
    assert all(len(hits) == 10 for hits in got)
    h.run(store.close())

    # Same seq range but different events (another database grown as large): refused too.
    h.fill(store := h.open(), 200)
    shutil.rmtree(snapshot_dir(h), ignore_errors=True)
    h.run(store.close())
    shutil.copytree(kept, snapshot_dir(h))
    store = h.open()
    h.knn(store, queries)
    assert h.cached(store).loaded_from == "database"
    h.run(store.close())

    # Another model: the snapshot's meta names the model it was made with.
    other = SnapshotDir(h.path.with_name(h.path.name + ".vectors"), "another-model", h.embedder.dim)
    assert other.load(TENANT, lambda seq, event_id: True) is None


def test_forget_erases_the_vector_from_the_snapshot_on_disk(harness):
    h = harness
    store = h.open()
    pairs = h.fill(store, 100)
    h.knn(store, unit(h.rng, 3, h.embedder.dim))
    folder = snapshot_dir(h)
    victim, victim_vector = pairs[17]
    needle = victim_vector.astype(np.float32).tobytes()
    assert any(needle in p.read_bytes() for p in folder.glob("vectors.*.npy"))

    h.run(store.forget(TENANT, victim.id, "user asked"))
    # at once: the row is zeroed in the file still in place
    assert not any(needle in p.read_bytes() for p in folder.iterdir())
    hits = h.knn(store, victim_vector[None, :])[0]
    assert all(h.run(store.get(TENANT, victim.id)).status == "forgotten" for _ in [0])
    forgotten_rowid = h.run(
        store.run_read(
            lambda c: c.execute("SELECT rowid FROM memories WHERE id = ?", (victim.id,)).fetchone()
        )
    )[0]
    assert forgotten_rowid not in [r for r, _ in hits]

    h.run(store.close())  # the rewritten snapshot leaves the row out entirely
    rowids = np.concatenate([np.load(p) for p in folder.glob("rowids.*.npy")])
    assert forgotten_rowid not in rowids
    assert len(rowids) == 99
    assert not any(needle in p.read_bytes() for p in folder.iterdir())

    restarted = h.open()
    hits = h.knn(restarted, victim_vector[None, :])[0]
    assert forgotten_rowid not in [r for r, _ in hits]
    h.run(restarted.close())


def test_forget_from_a_store_without_cache_still_scrubs_the_snapshot(harness):
    h = harness
    store = h.open()
    pairs = h.fill(store, 80)
    h.knn(store, unit(h.rng, 2, h.embedder.dim))
    h.run(store.close())
    victim, vector = pairs[5]
    cli = h.open(vector_cache=False)  # as the CLI or another tool would
    h.run(cli.forget(TENANT, victim.id, "gdpr"))
    h.run(cli.close())
    needle = vector.astype(np.float32).tobytes()
    assert not any(needle in p.read_bytes() for p in snapshot_dir(h).iterdir())
