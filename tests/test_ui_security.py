"""The inspector's guards, each probed over HTTP against a served memrelay with keys:
the session cookie, CSRF on every form, the Content-Security-Policy, escaping, and
tenant isolation through every page and form field. (tests/test_ui_browser.py drives
the same pages in Chromium.)"""

from __future__ import annotations

import base64
import html
import json
import re
import time
from http.cookies import SimpleCookie
from typing import Any

import httpx
import pytest

from memory_core.backends import jobs_for
from proxy.edge.keys import KeyStore, digest
from tests.text_checks import without_generated_ids
from tests.ui_world import HOSTILE, World, build_world, memory

UI = "/memrelay/ui"


class Browser:
    """A tiny cookie-keeping client: httpx's jar (rightly) keeps Secure cookies off http."""

    def __init__(self, world: World) -> None:
        self.http = httpx.Client(base_url=world.server.url, timeout=30)
        self.cookies: dict[str, str] = {}
        self.last_set_cookie: list[str] = []

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = kwargs.pop("headers", {})
        if self.cookies:
            headers["cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        response = self.http.request(method, path, headers=headers, **kwargs)
        self.last_set_cookie = response.headers.get_list("set-cookie")
        for line in self.last_set_cookie:
            jar: SimpleCookie = SimpleCookie()
            jar.load(line)
            for name, morsel in jar.items():
                if morsel["max-age"] == "0" or morsel.value in ("", '""'):
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value
        return response

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", UI + path, **kwargs)

    def post(self, path: str, data: dict[str, Any], **kwargs: Any) -> httpx.Response:
        return self.request("POST", UI + path, data=data, **kwargs)

    def sign_in(self, key: str, tenant: str = "") -> httpx.Response:
        page = self.get("/signin")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
        return self.post("/signin", {"csrf": token, "key": key, "tenant": tenant})

    def csrf(self) -> str:
        page = self.get("/jobs")
        assert page.status_code == 200, page.text
        return re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)


@pytest.fixture
def world(memory_proxy: Any, tmp_path: Any) -> World:
    return build_world(memory_proxy, tmp_path)


@pytest.fixture
def alice(world: World) -> Browser:
    browser = Browser(world)
    response = browser.sign_in(world.keys["alice"])
    assert response.status_code == 303 and response.headers["location"] == UI + "/memories"
    return browser


def test_session_cookie_is_signed_httponly_secure_strict_and_holds_no_key(world: World) -> None:
    browser = Browser(world)
    browser.sign_in(world.keys["alice"])
    session = [c for c in browser.last_set_cookie if c.startswith("memrelay_ui=")]
    assert len(session) == 1
    attributes = {a.strip().lower() for a in session[0].split(";")[1:]}
    assert {"httponly", "secure", "samesite=strict", f"path={UI}"} <= attributes
    value = browser.cookies["memrelay_ui"]
    body = base64.urlsafe_b64decode(value.split(".")[0] + "==").decode()
    key = world.keys["alice"]
    for secret in (key, key[3:], digest(key)):
        assert secret not in value and secret not in body
    assert json.loads(body)["t"] == "alice"


def test_pages_need_a_session_and_the_api_still_needs_a_key(world: World) -> None:
    browser = Browser(world)
    for path in ("", "/memories", f"/memories/{world.ids['tea']}", "/jobs", "/stats", "/inject"):
        response = browser.get(path)
        assert response.status_code == 303 and response.headers["location"] == UI + "/signin"
    assert browser.get("/signin").status_code == 200
    wrong = browser.sign_in("mr_" + "x" * 43)
    assert wrong.status_code == 401 and "unknown or revoked key" in wrong.text
    assert browser.get("/memories").status_code == 303
    # The API is unchanged: no key, no answer; a browser cookie is no key there.
    browser.sign_in(world.keys["alice"])
    api = browser.request("GET", "/memrelay/v1/memories", headers={"X-Memrelay-Tenant": "alice"})
    assert api.status_code == 401


def test_forged_replayed_and_revoked_sessions_end(world: World, tmp_path: Any) -> None:
    browser = Browser(world)
    browser.sign_in(world.keys["alice"])
    good = browser.cookies["memrelay_ui"]
    body, mac = good.split(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=="))
    payload["t"] = "bob"
    forged = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    browser.cookies["memrelay_ui"] = f"{forged}.{mac}"
    assert browser.get("/memories").status_code == 303
    browser.cookies["memrelay_ui"] = good
    assert browser.get("/memories").status_code == 200
    # Signing out ends the session: the same cookie replayed is refused.
    browser.post("/signout", {"csrf": browser.csrf()})
    browser.cookies["memrelay_ui"] = good
    assert browser.get("/memories").status_code == 303
    # Nor can the signed-out cookie be revived under a new session id: it is signed.
    payload = json.loads(base64.urlsafe_b64decode(body + "=="))
    payload["s"] = "a-fresh-session-id"
    revived = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    browser.cookies["memrelay_ui"] = f"{revived}.{mac}"
    assert browser.get("/memories").status_code == 303
    # Revoking the key ends its sessions at once.
    other = Browser(world)
    other.sign_in(world.keys["alice"])
    assert other.get("/memories").status_code == 200
    store = KeyStore(tmp_path / "keys.json")
    record = next(r for r in store.records if r.tenants == ["alice"])
    store.revoke(record.id)
    for _ in range(40):  # the served app re-reads the keys file within a second
        if other.get("/memories").status_code == 303:
            break
        time.sleep(0.1)
    assert other.get("/memories").status_code == 303


def test_every_form_needs_the_session_csrf_token(world: World, alice: Browser) -> None:
    bob = Browser(world)
    bob.sign_in(world.keys["bob"])
    foreign = bob.csrf()  # a valid token, of another session
    posts = [
        (f"/memories/{world.ids['city']}/correct", {"content": "The user lives in Paris"}),
        (f"/memories/{world.ids['city']}/forget", {}),
        ("/forget", {"id": world.ids["city"]}),
        (f"/jobs/{world.jobs['alice']}/retry", {}),
        ("/tenant", {"tenant": "alice"}),
        ("/signout", {}),
    ]
    for path, data in posts:
        for token in (None, "", "x" * 43, foreign):
            fields = dict(data) if token is None else {**data, "csrf": token}
            response = alice.post(path, fields)
            assert response.status_code == 403, (path, token, response.status_code)
    city = memory(world, "alice", world.ids["city"])
    assert city["status"] == "active" and city["content"] == "The user lives in Berlin"
    assert "dead" in alice.get("/jobs").text  # not retried
    assert alice.get("/memories").status_code == 200  # not signed out
    # The sign-in form has its own token, bound to a pre-session cookie.
    stranger = Browser(world)
    refused = stranger.post("/signin", {"key": world.keys["alice"], "csrf": "x"})
    assert refused.status_code == 403 and "memrelay_ui" not in stranger.cookies


def test_strict_csp_on_every_page_and_no_inline_script(world: World, alice: Browser) -> None:
    paths = [
        "/memories",
        "/memories?q=tea",
        f"/memories/{world.ids['hostile0']}",
        f"/memories/{world.ids['city']}/correct",
        f"/memories/{world.ids['city']}/forget",
        "/forget?q=tea",
        "/jobs",
        "/stats",
        "/inject?message=tea",
        "/tenant",
        "/signin",
        "/memories/mem_nope",
    ]
    for path in paths:
        response = alice.get(path)
        assert response.status_code in (200, 303, 404), path
        policy = response.headers["content-security-policy"]
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";") if " " in d.strip())
        assert directives["script-src"] == "'self'" and directives["default-src"] == "'none'"
        assert directives["frame-ancestors"] == "'none'" and directives["form-action"] == "'self'"
        assert "unsafe" not in policy
        if response.status_code != 303:
            for tag in re.findall(r"<script\b[^>]*>", response.text):
                assert "src=" in tag, (path, tag)
            assert " on" not in re.sub(r"&[a-z]+;|&#\d+;", "", _attributes(response.text))


def _attributes(html: str) -> str:
    """Every tag's attribute text (to look for event handler attributes)."""
    return " ".join(m.group(1) for m in re.finditer(r"<[a-zA-Z][a-zA-Z0-9]*(\s[^<>]*)>", html))


def test_memory_texts_are_escaped(world: World, alice: Browser) -> None:
    listing = alice.get("/memories?space=default").text
    for text in HOSTILE:
        escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        escaped = escaped.replace('"', "&#34;").replace("'", "&#39;")
        assert escaped in listing
    assert "<script>window.pwned" not in listing and "<img src=x" not in listing
    detail = alice.get(f"/memories/{world.ids['hostile1']}").text
    assert "<img src=x" not in detail and "&lt;img src=x" in detail


def test_tenant_isolation_through_every_page_and_field(world: World, alice: Browser) -> None:
    token = alice.csrf()
    bob_id, bob_job = world.ids["bob"], world.jobs["bob"]
    for path in (
        f"/memories/{bob_id}",
        f"/memories/{bob_id}/correct",
        f"/memories/{bob_id}/forget",
    ):
        assert alice.get(path).status_code == 404, path
    assert (
        alice.post(f"/memories/{bob_id}/correct", {"csrf": token, "content": "x"}).status_code
        == 404
    )
    assert alice.post(f"/memories/{bob_id}/forget", {"csrf": token}).status_code == 404
    # A forget that names one of bob's ids among alice's forgets nothing at all.
    mixed = alice.post("/forget", {"csrf": token, "id": [world.ids["tea"], bob_id]})
    assert mixed.status_code == 404
    assert memory(world, "alice", world.ids["tea"])["status"] == "active"
    assert alice.post(f"/jobs/{bob_job}/retry", {"csrf": token}).status_code == 404
    assert bob_job not in alice.get("/jobs").text
    assert alice.post("/tenant", {"csrf": token, "tenant": "bob"}).status_code == 403
    # Headers and query parameters naming another tenant change nothing on these pages.
    sneaky = {"X-Memrelay-Tenant": "bob", "X-Memrelay-Key": world.keys["bob"]}
    for path in ("/memories?tenant=bob&q=vault+code", "/inject?message=vault+code&tenant=bob"):
        text = alice.get(path, headers=dict(sneaky)).text
        assert "4711" not in without_generated_ids(text) and bob_id not in text
    assert "4711" not in without_generated_ids(alice.get("/stats", headers=dict(sneaky)).text)
    bob_memory = memory(world, "bob", bob_id)
    assert bob_memory["status"] == "active" and "4711" in bob_memory["content"]
    assert "upstream said 500 for bob" in jobs_text(world, "bob")


def test_an_erased_dead_job_offers_no_retry(world: World, alice: Browser) -> None:
    """A forget erased this dead job's conversation: the queue page offers no Retry for
    it (the API would refuse it), while another dead job keeps its button."""
    jobs = jobs_for(world.seed.store)
    run = world.seed.run
    erased = run(jobs.enqueue("alice", "default", {"user": "my pin is 1234"}, max_attempts=1))
    while (claimed := run(jobs.claim("test-owner", 60))) is not None:  # oldest first
        run(jobs.fail(claimed.id, "test-owner", "upstream said 500", 0))
        if claimed.id == erased.id:
            break
    assert run(jobs.erase_dead("alice", ["default"], lambda p: "pin" in p.get("user", ""))) == [
        erased.id
    ]
    page = alice.get("/jobs").text
    row = re.search(rf'<tr class="job status-dead" data-id="{erased.id}">(.*?)</tr>', page, re.S)
    assert row is not None and "erased by a forget" in row.group(1)
    assert f"/jobs/{erased.id}/retry" not in page
    kept = world.jobs["alice"]  # dead, its text kept
    assert f"/jobs/{kept}/retry" in page


def jobs_text(world: World, tenant: str) -> str:
    browser = Browser(world)
    browser.sign_in(world.keys[tenant])
    return browser.get("/jobs").text


def test_a_key_with_several_tenants_picks_among_them(world: World) -> None:
    browser = Browser(world)
    first = browser.sign_in(world.keys["both"])
    assert first.status_code == 303 and first.headers["location"] == UI + "/tenant"
    picker = browser.get("/tenant").text
    assert 'value="alice"' in picker and 'value="acme"' in picker and "bob" not in picker
    token = browser.csrf()
    assert browser.post("/tenant", {"csrf": token, "tenant": "bob"}).status_code == 403
    moved = browser.post("/tenant", {"csrf": token, "tenant": "acme"})
    assert moved.status_code == 303
    assert 'id="tenant" href="/memrelay/ui/tenant">acme<' in browser.get("/memories").text
    assert world.ids["tea"] not in browser.get("/memories").text
    assert Browser(world).sign_in(world.keys["alice"], tenant="bob").status_code == 403


def test_open_mode_signs_in_with_a_tenant_alone(memory_proxy: Any) -> None:
    server, seed = memory_proxy()
    seed.add("team", "default", "The team meets on Mondays")
    world = World(server, seed, {})
    browser = Browser(world)
    page = browser.get("/signin").text
    assert "memrelay runs open" in page and 'name="key"' not in page
    token = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    assert browser.post("/signin", {"csrf": token, "tenant": "team"}).status_code == 303
    assert "The team meets on Mondays" in browser.get("/memories").text


def test_injection_preview_is_what_the_upstream_receives(
    world: World, alice: Browser, fake: Any
) -> None:
    message = "What should I drink, and how should I write?"
    preview = alice.get("/inject", params={"message": message, "spaces": "default,work"})
    shown = re.search(r'<pre id="system-message">(.*?)</pre>', preview.text, re.DOTALL)
    assert shown is not None
    fake.reset()
    chat = httpx.post(
        world.server.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": message}]},
        headers={
            "X-Memrelay-Key": world.keys["alice"],
            "X-Memrelay-Tenant": "alice",
            "X-Memrelay-Read-Spaces": "default,work",
            "X-Memrelay-Memory": "read",
        },
        timeout=60,
    )
    assert chat.status_code == 200 and chat.headers["x-memrelay-recall-status"] == "ok"
    sent = fake.chat_requests()[-1].json()["messages"][0]
    assert sent["role"] == "system"
    assert html.unescape(shown.group(1)) == sent["content"]
    # The stats page counts that recall for alice (the preview's own recall is not counted).
    stats = alice.get("/stats").text
    assert re.search(r'id="ok-rate">100\.0%<', stats) and "1 recalls since" in stats
    assert "0 recalls since" in jobs_stats(world, "bob")
    # With memory on, recall and learning's `before` hooks run side by side: the recall
    # is still counted (the tally reads its status once the upstream has answered).
    again = httpx.post(
        world.server.url + "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": message}]},
        headers={
            "X-Memrelay-Key": world.keys["alice"],
            "X-Memrelay-Tenant": "alice",
            "X-Memrelay-Read-Spaces": "default,work",
        },
        timeout=60,
    )
    assert again.headers["x-memrelay-recall-status"] == "ok"
    assert "2 recalls since" in alice.get("/stats").text


def jobs_stats(world: World, tenant: str) -> str:
    browser = Browser(world)
    browser.sign_in(world.keys[tenant])
    return browser.get("/stats").text
