"""Per-tenant recall slots: a flooding tenant's extra recalls wait; others go on."""

from __future__ import annotations

import asyncio

import pytest

from proxy.memory.recall import TenantSlots


def test_a_full_tenant_waits_while_another_tenant_goes_ahead():
    async def main() -> None:
        slots = TenantSlots(cap=2)
        release = asyncio.Event()
        running: list[str] = []

        async def work(name: str) -> str:
            running.append(name)
            await release.wait()
            return name

        flood = [
            asyncio.ensure_future(slots.run("flood", lambda n=f"flood{i}": work(n)))
            for i in range(3)
        ]
        for _ in range(5):
            await asyncio.sleep(0)
        assert running == ["flood0", "flood1"]  # the third waits for a slot
        quiet = asyncio.ensure_future(slots.run("quiet", lambda: work("quiet")))
        for _ in range(5):
            await asyncio.sleep(0)
        assert running[-1] == "quiet"  # not queued behind the flood
        release.set()
        assert await asyncio.gather(*flood, quiet) == ["flood0", "flood1", "flood2", "quiet"]
        assert len(slots) == 0  # nothing kept for idle tenants

    asyncio.run(main())


def test_a_recall_that_gives_up_while_waiting_frees_nothing_and_leaks_nothing():
    async def main() -> None:
        slots = TenantSlots(cap=1)
        release = asyncio.Event()
        started: list[int] = []

        async def work(i: int) -> int:
            started.append(i)
            await release.wait()
            return i

        first = asyncio.ensure_future(slots.run("t", lambda: work(1)))
        await asyncio.sleep(0)
        with pytest.raises(TimeoutError):  # as the recall budget does
            await asyncio.wait_for(slots.run("t", lambda: work(2)), 0.01)
        third = asyncio.ensure_future(slots.run("t", lambda: work(3)))
        await asyncio.sleep(0)
        assert started == [1]
        release.set()
        assert await asyncio.gather(first, third) == [1, 3]
        assert started == [1, 3]  # the abandoned recall never reached the store
        assert len(slots) == 0

    asyncio.run(main())
