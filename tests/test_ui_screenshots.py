"""A screenshot of every inspector page, taken in Chromium from a served memrelay.

In the test suite they go to a temporary folder (and must be real, non-blank PNGs);
`MEMRELAY_SCREENSHOTS=docs/img pytest tests/test_ui_screenshots.py` refreshes the
README's pictures in docs/img.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ui_world import World, browser_or_skip, build_world


@pytest.fixture
def world(memory_proxy: Any, tmp_path: Any) -> World:
    return build_world(memory_proxy, tmp_path)


@pytest.fixture
def browser(world: World) -> Iterator[Any]:
    manager, browser = browser_or_skip()
    yield browser
    browser.close()
    manager.stop()


def test_screenshots_of_every_page(browser: Any, world: World, tmp_path: Path, fake: Any) -> None:
    for text in ("What do I drink?", "Where do I live?"):  # recalls for the stats page
        response = httpx.post(
            world.server.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": text}]},
            headers={"X-Memrelay-Key": world.keys["alice"], "X-Memrelay-Tenant": "alice"},
            timeout=60,
        )
        assert response.status_code == 200
    out = Path(os.environ.get("MEMRELAY_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    shots: list[Path] = []

    def shoot(name: str, full: bool = True) -> None:
        path = out / f"ui-{name}.png"
        page.screenshot(path=str(path), full_page=full)
        shots.append(path)

    page.goto(world.ui + "/signin")
    shoot("signin", full=False)
    page.fill("#key", world.keys["alice"])
    page.click("#signin")
    page.wait_for_url(re.compile(r".*/memories$"))
    page.goto(world.ui + "/memories?space=default&space=work")
    shoot("memories")
    page.goto(world.ui + "/memories?q=what+does+the+user+drink")
    shoot("search")
    page.goto(world.ui + f"/memories/{world.ids['dog']}")
    shoot("timeline")
    page.goto(world.ui + f"/memories/{world.ids['city']}/correct")
    shoot("correct", full=False)
    page.goto(world.ui + f"/memories/{world.ids['dog']}/forget")
    shoot("forget", full=False)
    page.goto(world.ui + "/forget?q=the+user%27s+dog")
    shoot("forget-query", full=False)
    page.goto(world.ui + "/jobs")
    shoot("jobs", full=False)
    page.goto(world.ui + "/stats")
    shoot("stats")
    page.goto(world.ui + "/inject?message=What+should+I+drink+today%3F&spaces=default%2Cwork")
    shoot("inject")
    context.close()
    for path in shots:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        assert width == 1280 and height >= 600 and len(data) > 20_000, path
