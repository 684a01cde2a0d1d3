"""A tenant's vector cache persisted next to the SQLite file, memory-mapped on load.

Why: reading a million vectors back out of sqlite-vec took about 45 s after a restart,
and recall failed open all that time. A snapshot is the cache's arrays as `.npy` files
(vectors, sign bits, rowids, space and kind codes) plus `meta.json`; loading maps the
two big arrays copy-on-write (no read up front: the sign-bit pass touches 48 bytes a
vector, the exact rescoring only the candidates) and the cache then applies the events
after the snapshot's `seq`, exactly as it does for any stale copy.

A snapshot is used only if it is for the same model and dimension, its `seq` is not
past the database's newest event for the tenant, and the event at its `seq` is still
the one it was taken at (a replaced or restored database is caught). Otherwise it is
ignored, deleted and rebuilt from the database.

When files are written: after a full load from the database (of at least SNAPSHOT_FROM
vectors), and at store close for every tenant changed since its snapshot. Forgetting
never waits for that: the forgetting store zeroes the memory's row in the snapshot on
disk (and fsyncs) in the same call, and the cache does the same when it applies a
`forgotten` event, so a forgotten vector is gone from the file at once, and from the
rewritten file for good. Writes go to new file names and switch over by replacing
`meta.json` atomically; the old files are then unlinked.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SNAPSHOT_FROM = 2_000  # smaller tenants load from the database fast enough
FILES = ("vectors", "bits", "rowids", "spaces", "kinds")


@dataclass
class Snapshot:
    seq: int
    event_id: str | None
    codes: dict[str, int]
    arrays: dict[str, np.ndarray]


class SnapshotDir:
    """Snapshots of every tenant under one directory (one sub-directory per tenant)."""

    def __init__(self, root: Path | str, model: str, dim: int) -> None:
        self.root = Path(root)
        self.model = model
        self.dim = dim
        self._lock = threading.Lock()  # one writer or scrubber at a time per process

    def tenant_dir(self, tenant: str) -> Path:
        return self.root / hashlib.sha256(tenant.encode()).hexdigest()[:32]

    def _meta(self, tenant: str) -> dict[str, Any] | None:
        try:
            meta = json.loads((self.tenant_dir(tenant) / "meta.json").read_text())
        except (OSError, ValueError):
            return None
        if meta.get("model") != self.model or meta.get("dim") != self.dim:
            return None
        if meta.get("tenant") != tenant:
            return None
        return meta

    def load(self, tenant: str, check: Any) -> Snapshot | None:
        """The tenant's snapshot if `check(seq, event_id)` says it is still valid; an
        invalid one is deleted (it is rebuilt from the database)."""
        folder = self.tenant_dir(tenant)
        if not folder.exists():
            return None
        meta = self._meta(tenant)
        if meta is None or not check(meta["seq"], meta.get("event_id")):
            self.delete(tenant)
            return None
        try:
            arrays = {
                name: np.load(
                    folder / meta["files"][name],
                    mmap_mode="c" if name in ("vectors", "bits") else None,
                )
                for name in FILES
            }
        except (OSError, ValueError, KeyError):
            self.delete(tenant)
            return None
        count = meta["count"]
        if any(len(arrays[n]) != count for n in ("vectors", "rowids", "spaces", "kinds")):
            self.delete(tenant)
            return None
        return Snapshot(meta["seq"], meta.get("event_id"), meta["codes"], arrays)

    def write(
        self,
        tenant: str,
        seq: int,
        event_id: str | None,
        codes: dict[str, int],
        arrays: dict[str, np.ndarray],
    ) -> None:
        """Write new files, switch `meta.json` to them atomically, unlink the old ones."""
        folder = self.tenant_dir(tenant)
        with self._lock:
            folder.mkdir(parents=True, exist_ok=True)
            old = self._meta(tenant)
            generation = (old or {}).get("generation", 0) + 1
            files = {name: f"{name}.{generation}.{os.getpid()}.npy" for name in FILES}
            for name in FILES:
                path = folder / files[name]
                with path.open("wb") as handle:
                    np.save(handle, np.ascontiguousarray(arrays[name]))
                    handle.flush()
                    os.fsync(handle.fileno())
            meta = {
                "tenant": tenant,
                "model": self.model,
                "dim": self.dim,
                "seq": seq,
                "event_id": event_id,
                "count": len(arrays["rowids"]),
                "codes": codes,
                "files": files,
                "generation": generation,
            }
            tmp = folder / f"meta.json.{os.getpid()}.tmp"  # the search process writes too
            tmp.write_text(json.dumps(meta))
            os.replace(tmp, folder / "meta.json")
            for path in folder.iterdir():
                if path.suffix == ".npy" and path.name not in files.values():
                    path.unlink(missing_ok=True)

    def scrub(self, tenant: str, rowids: list[int]) -> int:
        """Zero these rows' vectors (and sign bits) in the tenant's snapshot on disk, in
        place, and fsync: a forgotten memory's vector leaves the file now. Returns the
        rows zeroed."""
        folder = self.tenant_dir(tenant)
        if not rowids or not folder.exists():
            return 0
        with self._lock:
            meta = self._meta(tenant)
            if meta is None:
                self.delete(tenant)
                return 0
            stored = np.load(folder / meta["files"]["rowids"])
            rows = np.flatnonzero(np.isin(stored, np.asarray(rowids, dtype=np.int64)))
            if not len(rows):
                return 0
            for name in ("vectors", "bits"):
                _zero_rows(folder / meta["files"][name], rows)
            return len(rows)

    def delete(self, tenant: str) -> None:
        folder = self.tenant_dir(tenant)
        with self._lock:
            (folder / "meta.json").unlink(missing_ok=True)  # invalid first, then the data
            if folder.exists():
                for path in folder.iterdir():
                    path.unlink(missing_ok=True)
                folder.rmdir()


def _zero_rows(path: Path, rows: np.ndarray) -> None:
    array = np.load(path, mmap_mode="r+")
    if path.name.startswith("bits"):
        array[:, rows] = 0  # sign bits are stored word-major: (words, rows)
    else:
        array[rows] = 0
    array.flush()
    del array
    with path.open("rb+") as handle:
        os.fsync(handle.fileno())
