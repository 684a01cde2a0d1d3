"""Downstream.run: a client's disconnect ends the handler quietly, anything else that
cancels the request still propagates, and the disconnect watch never outlives it."""

from __future__ import annotations

import asyncio

import pytest

from proxy.relay.downstream import Downstream

BODY = {"type": "http.request", "body": b'{"model": "m"}', "more_body": False}


class Client:
    """An ASGI `receive`: the body, then nothing until `leave()` sends a disconnect."""

    def __init__(self) -> None:
        self.sent_body = False
        self.gone = asyncio.Event()
        self.waiting = 0

    async def receive(self) -> dict:
        if not self.sent_body:
            self.sent_body = True
            return BODY
        self.waiting += 1
        try:
            await self.gone.wait()
        finally:
            self.waiting -= 1
        return {"type": "http.disconnect"}

    def leave(self) -> None:
        self.gone.set()


def test_disconnect_mid_handler_ends_run_without_error() -> None:
    asyncio.run(_disconnect_mid_handler_ends_run_without_error())


async def _disconnect_mid_handler_ends_run_without_error() -> None:
    client = Client()
    downstream = Downstream(client.receive)
    reached = asyncio.Event()
    finished = False

    async def handler() -> None:
        nonlocal finished
        assert await downstream.read_body(1024) == BODY["body"]
        reached.set()
        await asyncio.sleep(30)  # the upstream answer that never comes
        finished = True

    run = asyncio.create_task(downstream.run(handler))
    await reached.wait()
    client.leave()
    await asyncio.wait_for(run, 2)  # returns, does not raise
    assert downstream.disconnected
    assert not finished
    assert run.cancelling() == 0  # the disconnect's cancellation was taken back


def test_disconnect_while_the_body_is_read() -> None:
    asyncio.run(_disconnect_while_the_body_is_read())


async def _disconnect_while_the_body_is_read() -> None:
    async def receive() -> dict:
        return {"type": "http.disconnect"}

    downstream = Downstream(receive)
    reached_after = False

    async def handler() -> None:
        nonlocal reached_after
        await downstream.read_body(1024)
        reached_after = True

    await asyncio.wait_for(downstream.run(handler), 2)
    assert downstream.disconnected and not reached_after


def test_a_cancel_from_outside_still_propagates_after_a_disconnect() -> None:
    asyncio.run(_a_cancel_from_outside_still_propagates_after_a_disconnect())


async def _a_cancel_from_outside_still_propagates_after_a_disconnect() -> None:
    """A server shutting down cancels the request task: when that comes while the handler
    is still cleaning up after the client left, run() must not swallow it."""
    client = Client()
    downstream = Downstream(client.receive)
    reached = asyncio.Event()
    cleaning = asyncio.Event()

    async def handler() -> None:
        await downstream.read_body(1024)
        reached.set()
        try:
            await asyncio.sleep(30)
        finally:
            cleaning.set()
            await asyncio.sleep(1)  # cleanup that awaits (closing the upstream stream)

    run = asyncio.create_task(downstream.run(handler))
    await reached.wait()
    client.leave()
    await cleaning.wait()  # the disconnect's cancellation is being handled
    run.cancel()  # then the server shuts down
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(run, 2)
    assert downstream.disconnected


def test_the_disconnect_watch_ends_with_the_handler() -> None:
    asyncio.run(_the_disconnect_watch_ends_with_the_handler())


async def _the_disconnect_watch_ends_with_the_handler() -> None:
    client = Client()
    downstream = Downstream(client.receive)

    async def handler() -> None:
        await downstream.read_body(1024)
        await asyncio.sleep(0)  # the watch is now waiting in receive()

    await downstream.run(handler)
    for _ in range(3):
        await asyncio.sleep(0)
    assert client.waiting == 0  # cancelled: no task left listening to a finished request
    assert not downstream.disconnected


def test_a_late_disconnect_after_the_answer_changes_nothing() -> None:
    asyncio.run(_a_late_disconnect_after_the_answer_changes_nothing())


async def _a_late_disconnect_after_the_answer_changes_nothing() -> None:
    client = Client()
    downstream = Downstream(client.receive)

    async def handler() -> None:
        await downstream.read_body(1024)

    await downstream.run(handler)
    client.leave()
    await asyncio.sleep(0.01)
    assert not downstream.disconnected


def test_body_streamed_through_the_pump() -> None:
    asyncio.run(_body_streamed_through_the_pump())


async def _body_streamed_through_the_pump() -> None:
    chunks = [
        {"type": "http.request", "body": b"a" * 10, "more_body": True},
        {"type": "http.request", "body": b"b" * 10, "more_body": False},
    ]
    never = asyncio.Event()

    async def receive() -> dict:
        if chunks:
            return chunks.pop(0)
        await never.wait()
        return {"type": "http.disconnect"}

    downstream = Downstream(receive)
    got: list[bytes] = []

    async def handler() -> None:
        async for chunk in downstream.body_chunks():
            got.append(chunk)

    await asyncio.wait_for(downstream.run(handler), 2)
    assert b"".join(got) == b"a" * 10 + b"b" * 10
