"""Browser sessions of the inspector: a signed cookie that refers to a key, never holds it.

The cookie carries the key's id, the tenant picked, a random session id and an expiry,
signed with HMAC-SHA256 under a server secret (MEMRELAY_UI_SECRET, or a random one per
process). The raw key is read once, at sign-in, checked against the keys file and
dropped. Every request re-checks the referred key in the keys file, so revoking the key,
or taking the tenant off it, ends its sessions at once. The edge (proxy/edge/auth.py)
calls `identify` for the inspector's paths: that is where who a browser is gets decided,
once, like an API request's headers.

CSRF tokens are HMACs of the session id: a form posted from elsewhere cannot carry one.
Before sign-in, a short-lived pre-session cookie plays the same role for the sign-in form.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any

from proxy.edge.identity import Identity
from proxy.edge.keys import KeyRecord, KeyStore
from proxy.memory.scoping import MemoryScope

PREFIX = "/memrelay/ui"
COOKIE = "memrelay_ui"
PRE_COOKIE = "memrelay_ui_signin"
SESSION_STATE = "memrelay_ui_session"
PRE_SESSION_SECONDS = 1800.0


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in browser: which key (None when memrelay runs open), which tenant."""

    sid: str
    key_id: str | None
    tenant: str
    expires_at: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def cookie_value(headers: list[tuple[bytes, bytes]], name: str) -> str | None:
    """The value of cookie `name`; None when absent, or sent more than once (ambiguous)."""
    found: list[str] = []
    for key, value in headers:
        if key.lower() != b"cookie":
            continue
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(value.decode("latin-1"))
        except Exception:
            continue
        if name in jar:
            found.append(jar[name].value)
    return found[0] if len(found) == 1 else None


class BrowserSessions:
    """Signs, reads and checks inspector sessions; ends them on sign-out."""

    def __init__(self, secret: str | None, keys: KeyStore, default_tenant: str, hours: float):
        self._secret = hashlib.sha256((secret or secrets.token_hex(32)).encode()).digest()
        self.keys = keys
        self.default_tenant = default_tenant
        self.lifetime = hours * 3600
        self._ended: dict[str, float] = {}  # session ids signed out, until they expire

    # -- signing ---------------------------------------------------------------------

    def _mac(self, purpose: str, text: str) -> str:
        return _b64(hmac.new(self._secret, f"{purpose}|{text}".encode(), "sha256").digest())

    def _sign(self, purpose: str, payload: dict[str, Any]) -> str:
        body = _b64(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
        return f"{body}.{self._mac(purpose, body)}"

    def _open(self, purpose: str, token: str | None) -> dict[str, Any] | None:
        if not token or token.count(".") != 1:
            return None
        body, mac = token.split(".")
        if not hmac.compare_digest(mac, self._mac(purpose, body)):
            return None
        try:
            payload = json.loads(_unb64(body))
        except ValueError:
            return None
        if not isinstance(payload, dict) or not isinstance(payload.get("e"), int | float):
            return None
        return payload if payload["e"] > time.time() else None

    # -- sessions --------------------------------------------------------------------

    def start(self, key_id: str | None, tenant: str, sid: str | None = None) -> tuple[str, Session]:
        """A new session (or `sid` moved to another tenant): the cookie value and the session."""
        session = Session(
            sid or secrets.token_urlsafe(18), key_id, tenant, time.time() + self.lifetime
        )
        payload = {"s": session.sid, "k": key_id, "t": tenant, "e": session.expires_at}
        return self._sign("session", payload), session

    def end(self, session: Session) -> None:
        now = time.time()
        self._ended = {sid: until for sid, until in self._ended.items() if until > now}
        self._ended[session.sid] = session.expires_at

    def read(self, headers: list[tuple[bytes, bytes]]) -> Session | None:
        """The session the cookie names, if its signature, expiry, key and tenant all hold."""
        payload = self._open("session", cookie_value(headers, COOKIE))
        if payload is None:
            return None
        sid, key_id, tenant = payload.get("s"), payload.get("k"), payload.get("t")
        if not isinstance(sid, str) or not isinstance(tenant, str) or sid in self._ended:
            return None
        if self.keys.enforced:
            record = self.live(key_id) if isinstance(key_id, str) else None
            if record is None or not record.allows(tenant):
                return None
        elif key_id is not None:
            return None  # a key's session while memrelay runs open: sign in again
        return Session(sid, key_id, tenant, float(payload["e"]))

    def live(self, key_id: str) -> KeyRecord | None:
        """The unrevoked key record with this id (the keys file re-read if it changed)."""
        self.keys.refresh()
        for record in self.keys.records:
            if record.id == key_id and not record.revoked:
                return record
        return None

    def identify(
        self, headers: list[tuple[bytes, bytes]], state: dict[str, Any]
    ) -> Identity | None:
        """Called by the edge for inspector paths: the identity of the session, or None."""
        session = self.read(headers)
        if session is None:
            return None
        record = self.live(session.key_id) if session.key_id else None
        state[SESSION_STATE] = session
        return Identity(
            key_id=session.key_id,
            admin=bool(record and record.admin),
            memory=MemoryScope(session.tenant, "default", ("default",), "on"),
            tenant_given=True,
        )

    def serves(self, path: str) -> bool:
        return path == PREFIX or path.startswith(PREFIX + "/")

    # -- CSRF ------------------------------------------------------------------------

    def csrf_token(self, session: Session) -> str:
        return self._mac("csrf", session.sid)

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(str(token), self.csrf_token(session))

    def pre_session(self) -> tuple[str, str]:
        """For the sign-in form: the cookie value and the token the form must carry."""
        nonce = secrets.token_urlsafe(18)
        cookie = self._sign("signin", {"n": nonce, "e": time.time() + PRE_SESSION_SECONDS})
        return cookie, self._mac("signin-form", nonce)

    def pre_session_ok(self, headers: list[tuple[bytes, bytes]], token: str | None) -> bool:
        payload = self._open("signin", cookie_value(headers, PRE_COOKIE))
        if payload is None or not token or not isinstance(payload.get("n"), str):
            return False
        return hmac.compare_digest(str(token), self._mac("signin-form", payload["n"]))
