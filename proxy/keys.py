"""API keys that bind callers to tenants. Keys are stored hashed, compared in constant time.

A key is shown once, when it is created: `mr_` + 43 url-safe random characters. The file
keeps only its SHA-256 (the key is random, so a slow hash buys nothing), the tenants it
may use, and whether it is an admin key (any tenant, any admin route).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

KEY_PREFIX = "mr_"


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
    """Keys read from a JSON file; an empty or missing file means memrelay runs open."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.records: list[KeyRecord] = []
        self.reload()

    def reload(self) -> None:
        self.records = []
        if self.path is None or not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text() or "[]")
        except ValueError as exc:
            raise ValueError(f"keys file {self.path} is not valid JSON: {exc}") from exc
        self.records = [KeyRecord(**entry) for entry in data]

    @property
    def enabled(self) -> bool:
        return any(not r.revoked for r in self.records)

    def check(self, key: str | None) -> KeyRecord | None:
        """The live record of `key`, comparing hashes in constant time; None if unknown."""
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
