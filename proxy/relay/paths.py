"""Request paths: one canonical form, and the explicit list of what may reach the upstream.

Routing and the key check both run on the canonical path, and the upstream receives that
same path, so `//v1/chat/completions`, `/v1/./chat/completions`, `/v1%2Fchat/completions`
or `/v1/chat/completions.` cannot reach the upstream by a different road than the one
the key check saw.
"""

from __future__ import annotations

from urllib.parse import quote

# Routes memrelay serves itself; every other one goes to the upstream if allowed.
PUBLIC = frozenset({"/memrelay/healthz", "/memrelay/readyz"})  # probes: no key needed
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
# POSTed to these, a request gets memory; `/chat/completions` is the spelling of a base
# URL without /v1 (llama.cpp and others serve it), forwarded upstream as CHAT.
MEMORY_ROUTES = frozenset({CHAT, "/chat/completions", RESPONSES})
MEMRELAY = "/memrelay/"
OWN = frozenset({"/metrics"})


def canonical(path: str) -> str:
    """`path` (already percent-decoded by the server) with empty, `.` and `..` segments
    resolved, trailing dots and spaces cut from each segment, no trailing slash."""
    parts: list[str] = []
    for segment in path.replace("\\", "/").split("/"):
        segment = segment.rstrip(". ") if segment not in (".", "..") else segment
        if segment in ("", "."):
            continue
        if segment == "..":
            if parts:
                parts.pop()
            continue
        parts.append(segment)
    return "/" + "/".join(parts)


def raw_form(path: str) -> bytes:
    """The canonical path percent-encoded for the wire (what the upstream receives)."""
    return quote(path, safe="/:@!$&'()*+,;=-._~").encode("ascii")


def parse_extras(setting: str) -> tuple[str, ...]:
    """`/health,/props` -> ('/health', '/props'); each must start with `/`, never /memrelay."""
    extras = []
    for item in setting.split(","):
        item = item.strip()
        if not item:
            continue
        if not item.startswith("/") or item.startswith(MEMRELAY) or item == "/":
            raise ValueError(f"pass-through path {item!r} must start with / and not be /memrelay")
        extras.append(canonical(item).rstrip("/"))
    return tuple(extras)


def may_pass_through(path: str, extras: tuple[str, ...]) -> bool:
    """Whether a canonical path may be forwarded: /v1/... always, an extra only if named."""
    if path.startswith("/v1/"):
        return True
    return any(path == extra or path.startswith(extra + "/") for extra in extras)
