"""API keys that bind callers to tenants. Keys are stored hashed, compared in constant time.

A key is shown once, when it is created: `mr_` + 43 url-safe random characters. The file
keeps only its SHA-256 (the key is random, so a slow hash buys nothing), the tenants it
may use, and whether it is an admin key (any tenant, any admin route).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

KEY_PREFIX = "mr_"
RELOAD_EVERY = 0.25  # seconds between looks at the file: revocation lands within a second
log = logging.getLogger("memrelay.keys")


class KeysFileMissing(ValueError):
    """`serve` was given a keys file that does not exist."""


@dataclass
class KeyRecord:
    id: str
    sha256: str
    tenants: list[str] = field(default_factory=list)
    admin: bool = False
    name: str = ""
    created_at: float = 0.0
    revoked: bool = False

    def allows(self, tenant: str) -> bool:
        return self.admin or tenant in self.tenants

    def public(self) -> dict[str, object]:
        data = asdict(self)
        data.pop("sha256")
        return data


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyStore:
    """Keys read from a JSON file. With no file memrelay runs open; with one, every request
    needs a live key from it, even while it holds none (then every request is refused).

    The file is watched: an edit (or `reload()`, which SIGHUP calls) takes effect within
    RELOAD_EVERY seconds, without a restart. A file that cannot be read mid-edit keeps the
    keys last read; a file that disappears leaves no key valid.
    """

    def __init__(self, path: Path | None, *, must_exist: bool = False) -> None:
        self.path = path
        if must_exist and path is not None and not path.is_file():
            raise KeysFileMissing(
                f"keys file {path} does not exist; create it with "
                f"`memrelay keys create --keys-file {path} --tenant NAME`"
            )
        self.records: list[KeyRecord] = []
        self._seen: tuple[int, int, int] | None = None
        self._next_look = 0.0
        self.reload()

    @property
    def enforced(self) -> bool:
        """Whether requests need a key: whenever a keys file is configured."""
        return self.path is not None

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()  # type: ignore[union-attr]
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def reload(self) -> None:
        """Read the file now; raises ValueError if it is not a valid keys file."""
        if self.path is None:
            return
        signature = self._signature()
        if signature is None:
            self.records, self._seen = [], None
            return
        try:
            data = json.loads(self.path.read_text() or "[]")
        except ValueError as exc:
            raise ValueError(f"keys file {self.path} is not valid JSON: {exc}") from exc
        if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
            raise ValueError(f"keys file {self.path} must hold a JSON list of key objects")
        try:
            self.records = [KeyRecord(**entry) for entry in data]
        except TypeError as exc:
            raise ValueError(f"keys file {self.path} has a malformed key: {exc}") from exc
        self._seen = signature

    def refresh(self) -> None:
        """Reload if the file changed since last read (looked at most every RELOAD_EVERY s)."""
        if self.path is None:
            return
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + RELOAD_EVERY
        if self._signature() == self._seen:
            return
        try:
            self.reload()
            log.info("keys file reloaded: %d live keys", sum(not r.revoked for r in self.records))
        except (OSError, ValueError) as exc:
            log.warning("keys file changed but could not be read; keeping the old keys: %s", exc)

    @property
    def enabled(self) -> bool:
        return any(not r.revoked for r in self.records)

    def check(self, key: str | None) -> KeyRecord | None:
        """The live record of `key`, comparing hashes in constant time; None if unknown."""
        self.refresh()
        if not key:
            return None
        candidate = digest(key)
        found = None
        for record in self.records:  # no early exit: timing does not tell which key matched
            if hmac.compare_digest(candidate, record.sha256) and not record.revoked:
                found = record
        return found

    def create(
        self, tenants: list[str], admin: bool = False, name: str = ""
    ) -> tuple[str, KeyRecord]:
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        record = KeyRecord(
            id="key_" + secrets.token_hex(6),
            sha256=digest(key),
            tenants=sorted(set(tenants)),
            admin=admin,
            name=name,
            created_at=time.time(),
        )
        self.records.append(record)
        self._save()
        return key, record

    def revoke(self, key_id: str) -> KeyRecord:
        for record in self.records:
            if record.id == key_id:
                record.revoked = True
                self._save()
                return record
        raise KeyError(f"no key {key_id!r}")

    def _save(self) -> None:
        if self.path is None:
            raise ValueError("no keys file configured (--keys-file / MEMRELAY_KEYS_FILE)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps([asdict(r) for r in self.records], indent=2)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".keys-")
        with os.fdopen(fd, "w") as handle:
            handle.write(payload)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)
