"""An in-process copy of each tenant's active vectors, for fast exact KNN.

sqlite-vec's vec0 table is where vectors live (partitioned by tenant, erased on forget).
Its brute-force scan measured 50-80 ms at 100k vectors here, while one numpy
matrix-vector product over the same vectors takes about 6 ms. So recall reads vectors
from vec0 once per tenant and keeps them in memory, brought up to date from the event
feed: any change to a tenant appends an event, so `max(seq)` says whether the copy is
stale and the events since say which memories to re-read. Writers in other processes
(the CLI) are therefore seen too. Results still pass the SQL guard in `load_active`.

Past PREFILTER_FROM vectors, the exact scan (memory-bandwidth bound: ~7 ms for 100k
and ~70 ms for a million 384-float vectors on this machine) is preceded by a sign-bit pass: one bit
per dimension, Hamming distance over 48 bytes a vector, then the closest candidates
are scored exactly. Smaller tenants are always scanned exactly; from INT8_FROM vectors
through an int8 copy with error bounds (memory_core/sqlite/int8_scan.py: a quarter of
the bytes, same answer). A search holds the tenant's lock only to bring the copy up to
date and take a view of it (memory_core/sqlite/vector_view.py); the scan runs unlocked.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from memory_core.sqlite.db import Connection
from memory_core.sqlite.int8_scan import Int8Scan
from memory_core.sqlite.vector_snapshot import SNAPSHOT_FROM, Snapshot, SnapshotDir
from memory_core.sqlite.vector_view import VectorView, sign_bits

PREFILTER_FROM = 65_536  # vectors in a tenant before the sign-bit pass is used
PREFILTER_CANDIDATES = 4_000  # rescored exactly (at least 100 per result asked for)
INT8_FROM = 2_048  # vectors in a tenant before the exact scan goes through int8


class TenantVectors:
    """Vectors of one tenant's active memories, with space and kind codes per row."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.vectors = np.zeros((0, dim), dtype=np.float32)
        self.rowids = np.zeros(0, dtype=np.int64)
        self.spaces = np.zeros(0, dtype=np.int32)
        self.kinds = np.zeros(0, dtype=np.int32)
        self.alive = np.zeros(0, dtype=bool)
        # Sign bits stored word-major (one contiguous row per 64 dimensions): the
        # Hamming pass then streams each word of every vector in order.
        self.bits = np.zeros(((dim + 63) // 64, 0), dtype=np.uint64)
        self.size = 0
        self._position: dict[int, int] | None = {}
        self.codes: dict[str, int] = {}
        self.seq = 0
        self.dirty = False  # changed since its snapshot on disk (or never saved)
        self.int8: Int8Scan | None = None  # built on the first scan that wants it
        self.loaded_from = ""  # "snapshot" or "database": how the copy was first filled
        self.lock = threading.Lock()

    @property
    def position(self) -> dict[int, int]:
        """Row of each rowid; built on first need after a snapshot load (a million
        entries take a while, and a restart with no writes since never needs them)."""
        if self._position is None:
            self._position = {int(r): i for i, r in enumerate(self.rowids[: self.size])}
            for i in np.flatnonzero(~self.alive[: self.size]):
                self._position.pop(int(self.rowids[i]), None)
        return self._position

    def adopt(self, snapshot: Snapshot) -> None:
        """Take a snapshot's (memory-mapped) arrays as this copy, at its seq."""
        arrays = snapshot.arrays
        self.vectors = arrays["vectors"]
        self.bits = arrays["bits"]
        self.rowids = np.array(arrays["rowids"], dtype=np.int64)
        self.spaces = np.array(arrays["spaces"], dtype=np.int32)
        self.kinds = np.array(arrays["kinds"], dtype=np.int32)
        self.size = len(self.rowids)
        self.alive = np.ones(self.size, dtype=bool)
        self.int8 = None
        self.codes = dict(snapshot.codes)
        self._position = None
        self.seq = snapshot.seq
        self.dirty = False

    def arrays(self) -> dict[str, np.ndarray]:
        """The live rows only (dropped ones left out), for a snapshot."""
        keep: slice | np.ndarray = slice(0, self.size)
        if not self.alive[: self.size].all():
            keep = np.flatnonzero(self.alive[: self.size])
        return {
            "vectors": self.vectors[keep],
            "bits": self.bits[:, keep],
            "rowids": self.rowids[keep],
            "spaces": self.spaces[keep],
            "kinds": self.kinds[keep],
        }

    def code(self, name: str) -> int:
        return self.codes.setdefault(name, len(self.codes))

    def _grow(self, needed: int) -> None:
        capacity = len(self.rowids)
        if needed <= capacity:
            return
        new_capacity = max(needed, capacity * 2, 1024)
        for attr in ARRAYS:
            old = getattr(self, attr)
            grown = np.zeros((new_capacity, *old.shape[1:]), dtype=old.dtype)
            grown[: self.size] = old[: self.size]
            setattr(self, attr, grown)
        bits = np.zeros((self.bits.shape[0], new_capacity), dtype=np.uint64)
        bits[:, : self.size] = self.bits[:, : self.size]
        self.bits = bits

    def put(self, rowid: int, space: str, kind: str, vector: np.ndarray) -> None:
        index = self.position.get(rowid)
        if index is None:
            self._grow(self.size + 1)
            index = self.size
            self.size += 1
            self.position[rowid] = index
        self.vectors[index] = vector
        self.bits[:, index] = sign_bits(vector[None, :])[0]
        self.rowids[index] = rowid
        self.spaces[index] = self.code(space)
        self.kinds[index] = self.code(kind)
        self.alive[index] = True
        if self.int8 is not None:
            self.int8.set(index, self.vectors[index][None, :])

    def drop(self, rowid: int) -> None:
        index = self.position.pop(rowid, None)
        if index is not None:
            self.alive[index] = False
            self.vectors[index] = 0.0
            if self.int8 is not None:
                self.int8.clear(index)
        if self.size > 1024 and len(self.position) < self.size // 2:
            self._compact()

    def _compact(self) -> None:
        """Squeeze out dropped rows once they are half of the matrix."""
        keep = np.flatnonzero(self.alive[: self.size])
        for attr in ARRAYS:
            array = getattr(self, attr)
            setattr(self, attr, array[keep].copy())
        self.bits = np.ascontiguousarray(self.bits[:, keep])
        self.size = len(keep)
        self.int8 = None  # rows moved: rebuilt on the next scan
        self._position = {int(r): i for i, r in enumerate(self.rowids[: self.size])}

    def put_many(
        self, rowids: np.ndarray, spaces: list[str], kinds: list[str], block: np.ndarray
    ) -> None:
        """Append rows known to be new (the first load of a tenant)."""
        start, count = self.size, len(rowids)
        self._grow(start + count)
        end = start + count
        self.vectors[start:end] = block
        self.bits[:, start:end] = sign_bits(block).T
        self.rowids[start:end] = rowids
        self.spaces[start:end] = [self.code(s) for s in spaces]
        self.kinds[start:end] = [self.code(k) for k in kinds]
        self.alive[start:end] = True
        if self.int8 is not None:
            self.int8.set(start, self.vectors[start:end])
        if self._position is not None:
            self._position.update((int(r), start + i) for i, r in enumerate(rowids))
        self.size = end

    def view(self) -> VectorView:
        """The rows as they are now, to search without holding the lock: arrays are
        replaced, never shrunk in place, when they grow or compact; rows past the view's
        `n` are not read; a row changed during a search is read old or new (its memory
        still passes the SQL guard). Call under `lock`: it may build the int8 copy."""
        n = self.size
        int8 = None
        if INT8_FROM <= n < PREFILTER_FROM:
            if self.int8 is None:
                self.int8 = Int8Scan(self.dim)
                self.int8.set(0, self.vectors[:n])
            int8 = self.int8
        return VectorView(
            n,
            self.vectors,
            self.rowids,
            self.spaces,
            self.kinds,
            self.alive,
            self.bits,
            self.codes,
            int8,
            PREFILTER_FROM,
            PREFILTER_CANDIDATES,
        )

    def search(
        self, vector: np.ndarray, spaces: list[str], kinds: list[str] | None, k: int
    ) -> list[tuple[int, float]]:
        return self.view().search(vector, spaces, kinds, k)

    def search_with_kinds(
        self, vector: np.ndarray, spaces: list[str], k: int, kinds: list[str], kinds_k: int
    ) -> tuple[list[tuple[int, float]], list[tuple[int, float]], int]:
        return self.view().search_with_kinds(vector, spaces, k, kinds, kinds_k)


ARRAYS = ("vectors", "rowids", "spaces", "kinds", "alive")  # one row per vector


class VectorCache:
    """Per-tenant vector copies, least recently used evicted past `max_vectors` in total."""

    def __init__(
        self, dim: int, max_vectors: int = 2_000_000, snapshots: SnapshotDir | None = None
    ) -> None:
        self.dim = dim
        self.max_vectors = max_vectors
        self.snapshots = snapshots
        self._tenants: OrderedDict[str, TenantVectors] = OrderedDict()
        self._lock = threading.Lock()

    def search(
        self,
        conn: Connection,
        tenant: str,
        spaces: list[str],
        kinds: list[str] | None,
        vector: np.ndarray,
        k: int,
    ) -> list[tuple[int, float]]:
        """KNN for one tenant, brought up to date from the event feed first; callers pass
        every hit through the SQL guard, so no snapshot is shared with other searches."""
        vectors = self._current(conn, tenant)
        with vectors.lock:
            view = vectors.view()
        return view.search(vector, spaces, kinds, k)  # the lock is not held while scanning

    def search_with_kinds(
        self,
        conn: Connection,
        tenant: str,
        spaces: list[str],
        vector: np.ndarray,
        k: int,
        kinds: list[str],
        kinds_k: int,
    ) -> tuple[list[tuple[int, float]], list[tuple[int, float]], int]:
        """`search` plus the nearest rows of `kinds` (TenantVectors.search_with_kinds)."""
        vectors = self._current(conn, tenant)
        with vectors.lock:
            view = vectors.view()
        return view.search_with_kinds(vector, spaces, k, kinds, kinds_k)

    def refresh(self, conn: Connection, tenant: str) -> None:
        """Bring `tenant`'s copy up to date now, if one is held (a forget elsewhere: its
        vector leaves this copy at once, not at the tenant's next scan)."""
        with self._lock:
            held = tenant in self._tenants
        if held:
            self._current(conn, tenant)

    def _current(self, conn: Connection, tenant: str) -> TenantVectors:
        head = (
            conn.execute("SELECT max(seq) FROM events WHERE tenant = ?", (tenant,)).fetchone()[0]
            or 0
        )
        with self._lock:
            vectors = self._tenants.get(tenant)
            if vectors is None:
                vectors = TenantVectors(self.dim)
                self._tenants[tenant] = vectors
            self._tenants.move_to_end(tenant)
        with vectors.lock:
            if vectors.seq == 0 and head:
                vectors.loaded_from = "snapshot"
                if not self._from_snapshot(conn, tenant, vectors, head):
                    vectors.loaded_from = "database"
                    self._load(conn, tenant, vectors)
                    vectors.seq = head
                    if self.snapshots is not None and vectors.size >= SNAPSHOT_FROM:
                        self._save(conn, tenant, vectors)
            if head > vectors.seq:
                self._apply(conn, tenant, vectors)
                vectors.seq = head
        self._evict()
        return vectors

    def _from_snapshot(
        self, conn: Connection, tenant: str, vectors: TenantVectors, head: int
    ) -> bool:
        if self.snapshots is None:
            return False

        def still_valid(seq: int, event_id: str | None) -> bool:
            if seq > head:
                return False  # the database is older than the snapshot: replaced
            row = conn.execute(
                "SELECT event_id FROM events WHERE seq = ? AND tenant = ?", (seq, tenant)
            ).fetchone()
            return row is not None and row[0] == event_id

        snapshot = self.snapshots.load(tenant, still_valid)
        if snapshot is None:
            return False
        vectors.adopt(snapshot)
        return True

    def _save(self, conn: Connection, tenant: str, vectors: TenantVectors) -> None:
        """Under the tenant's lock: write its snapshot at its current seq."""
        assert self.snapshots is not None
        row = conn.execute(
            "SELECT event_id FROM events WHERE seq = ? AND tenant = ?", (vectors.seq, tenant)
        ).fetchone()
        if row is None:
            return
        self.snapshots.write(tenant, vectors.seq, row[0], vectors.codes, vectors.arrays())
        vectors.dirty = False

    def save(self, conn: Connection) -> int:
        """Write the snapshot of every cached tenant changed since its last one (at
        close); tenants too small to need one are left out. Returns how many."""
        if self.snapshots is None:
            return 0
        with self._lock:
            tenants = list(self._tenants.items())
        saved = 0
        for tenant, vectors in tenants:
            with vectors.lock:
                if vectors.dirty and vectors.size >= SNAPSHOT_FROM:
                    self._save(conn, tenant, vectors)
                    saved += 1
        return saved

    def _load(self, conn: Connection, tenant: str, vectors: TenantVectors) -> None:
        cursor = conn.execute(
            "SELECT rowid, space, kind, embedding FROM memory_vec WHERE tenant = ?", (tenant,)
        )
        while batch := cursor.fetchmany(50_000):  # in blocks: a million rows per row is slow
            rowids, spaces, kinds, blobs = zip(*batch, strict=True)
            block = np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(-1, self.dim)
            vectors.put_many(np.asarray(rowids, dtype=np.int64), spaces, kinds, block)

    def _apply(self, conn: Connection, tenant: str, vectors: TenantVectors) -> None:
        changed = conn.execute(
            "SELECT DISTINCT m.rowid, m.status FROM events e JOIN memories m ON m.id = e.memory_id"
            " WHERE e.tenant = ? AND e.seq > ? AND m.tenant = ?",
            (tenant, vectors.seq, tenant),
        ).fetchall()
        forgotten: list[int] = []
        for rowid, status in changed:
            row = None
            if status == "active":
                row = conn.execute(
                    "SELECT space, kind, embedding FROM memory_vec WHERE rowid = ?", (rowid,)
                ).fetchone()
            if row is None:
                vectors.drop(rowid)
                if status == "forgotten":
                    forgotten.append(rowid)
            else:
                vectors.put(rowid, row[0], row[1], np.frombuffer(row[2], dtype=np.float32))
        if changed:
            vectors.dirty = True
        if forgotten and self.snapshots is not None:
            # whoever forgot scrubbed the file already; this covers any other writer
            self.snapshots.scrub(tenant, forgotten)

    def _evict(self) -> None:
        with self._lock:
            total = sum(v.size for v in self._tenants.values())
            while total > self.max_vectors and len(self._tenants) > 1:
                _, evicted = self._tenants.popitem(last=False)
                total -= evicted.size

    def forget_tenant(self, tenant: str) -> None:
        with self._lock:
            self._tenants.pop(tenant, None)
