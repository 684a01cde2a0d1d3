"""Hybrid search in a process of its own, beside the server, supervised.

Why: at 16 concurrent clients memory-on throughput was bound by the GIL, not by the
cores. The search (ranking, row decoding, the scan's bookkeeping: about 3 ms of Python
a recall) and the event loop (every request's and every stream chunk's Python) took
turns on one lock, and each turn the loop waited for was a turn every client waited
for. On the benchmark at c=16, skipping the query embedding (ONNX, which releases the
GIL) gained nothing, while skipping the search gained 40% (docs/benchmarks.md).

So the store embeds the query as before (batched, ahead of learning's embedding work),
then sends the search here: a child process (memory_core/sqlite/search_worker.py)
that reads the same SQLite file through its own connections and keeps its own vector
copy, up to date from the database's events as the parent's is (every search checks
the tenant's newest event first, so a write committed before the search is seen).
The exchange is one pickled request and answer over one of a few socket pairs the
child inherits: nothing else can reach it.

Failure: if the child dies, the searches in flight and every search until it is back
run in-process on the store's readers (memory stays on); the supervisor logs the exit
and starts a new child, with growing delays while starting fails. `status()` says
whether it is up, its pid and how many times it was restarted (the admin metrics show
it). A caller that stops waiting (its recall passed its budget) leaves the exchange to
finish on its own, so a channel is never reused with an answer still in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memory_core.recall import Recalled
from memory_core.sqlite.hybrid_search import SearchRequest
from memory_core.sqlite.search_frames import frame, read_frame_async

log = logging.getLogger("memrelay.memory")

CHANNELS = 4  # searches in flight at once (threads in the child, as the store's readers)
START_TIMEOUT_S = 60.0
HUNG_AFTER_S = 1.0  # a search unanswered this long makes the parent ping the child
PING_TIMEOUT_S = 1.0  # a child that does not answer a ping this fast is taken as hung
RESTART_DELAYS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # then 30 s between attempts


class SearchProcessDown(RuntimeError):
    """The search process is not there (starting, restarting, closed): search in-process."""


class SearchFailed(RuntimeError):
    """The search itself failed in the search process (its message says how)."""


@dataclass(eq=False)
class _Channel:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    generation: int
    broken: bool = False


class SearchProcess:
    """The client and supervisor of one search process (see the module doc)."""

    def __init__(self, db: Path, model: str, dim: int, channels: int = CHANNELS) -> None:
        if channels < 1:
            raise ValueError("a search process needs at least one channel")
        self.db = Path(db)
        self.model = model
        self.dim = dim
        self.channels = channels
        self.restarts = 0
        self.last_exit: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._free: asyncio.Queue[_Channel | None] | None = None
        self._open: list[_Channel] = []
        self._heartbeat: _Channel | None = None  # a channel for `_alive` alone
        self._ping_lock = asyncio.Lock()
        self._generation = 0
        self._up = False
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._supervisor: asyncio.Task[None] | None = None

    # -- life -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the child and wait until every channel answers. If it cannot start, the
        server starts anyway: recalls search in-process and the supervisor keeps trying
        (an error in the log each time, `status()["up"]` False)."""
        self._loop = asyncio.get_running_loop()
        try:
            await self._spawn()
        except Exception:
            log.exception("search process did not start; searching in-process meanwhile")
        self._supervisor = asyncio.create_task(self._supervise(), name="memrelay-search-process")

    async def close(self) -> None:
        self._closing = True
        self._up = False
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        await self._stop_child()

    def usable(self) -> bool:
        """Up, and called from the loop it was started on (its streams live there)."""
        try:
            return self._up and asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def status(self) -> dict[str, Any]:
        proc = self._proc
        return {
            "up": self._up,
            "pid": proc.pid if proc is not None and self._up else None,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
        }

    async def _spawn(self) -> None:
        pairs = [socket.socketpair() for _ in range(self.channels + 1)]  # + the heartbeat
        child_fds = [theirs.fileno() for _, theirs in pairs]
        # The child imports this package from where the parent did (a checkout, a venv);
        # '' on the parent's path is its working directory (`python -c` in a checkout).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(os.path.abspath, sys.path))}
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-P",  # not the working directory first: the parent's own path decides
                "-m",
                "memory_core.sqlite.search_worker",
                str(self.db),
                self.model,
                str(self.dim),
                *map(str, child_fds),
                pass_fds=child_fds,
                env=env,
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            for ours, _ in pairs:
                ours.close()
            raise
        finally:
            for _, theirs in pairs:
                theirs.close()
        self._generation += 1
        opened: list[_Channel] = []
        try:
            for ours, _ in pairs:
                reader, writer = await asyncio.open_unix_connection(sock=ours)
                opened.append(_Channel(reader, writer, self._generation))
            for channel in opened:
                hello = await asyncio.wait_for(read_frame_async(channel.reader), START_TIMEOUT_S)
                if pickle.loads(hello)[0] != "ready":
                    raise RuntimeError("the search process did not say it was ready")
        except BaseException:
            for ours, _ in pairs[len(opened) :]:
                ours.close()
            for channel in opened:
                channel.writer.close()
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        free: asyncio.Queue[_Channel | None] = asyncio.Queue()
        for channel in opened[:-1]:
            free.put_nowait(channel)
        self._proc, self._open, self._free = proc, opened, free
        self._heartbeat = opened[-1]
        self._up = True

    async def _stop_child(self) -> None:
        self._lost()  # the child's threads see their sockets end and return
        proc = self._proc
        if proc is None:
            return
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        self.last_exit = proc.returncode

    def _kill(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()

    def _lost(self) -> None:
        """The child is gone: no new search goes to it, waiting callers are told."""
        self._up = False
        for channel in self._open:
            channel.writer.close()
        self._open = []
        self._heartbeat = None
        if self._free is not None:
            self._free.put_nowait(None)

    async def _supervise(self) -> None:
        """Wait for the child to exit; unless closing, start a new one. Never ends on an
        error of its own: it logs it and keeps watching."""
        while not self._closing:
            try:
                await self._watch_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("search process supervisor failed; retrying")
                await asyncio.sleep(RESTART_DELAYS_S[-1])

    async def _watch_once(self) -> None:
        proc = self._proc
        if proc is not None and proc.returncode is None:
            code = await proc.wait()
            self.last_exit = code
            self._lost()
            if self._closing:
                return
            self.restarts += 1
            log.error(
                "search process %s exited with %s; searching in-process until it is back",
                proc.pid,
                code,
            )
        if not self._up:
            attempt = 0
            while not self._closing:
                await asyncio.sleep(RESTART_DELAYS_S[min(attempt, len(RESTART_DELAYS_S) - 1)])
                attempt += 1
                try:
                    await self._spawn()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("search process did not start (attempt %d)", attempt)
                    continue
                log.warning("search process back (pid %s)", self._proc.pid if self._proc else "?")
                return

    # -- calls ----------------------------------------------------------------------

    async def search(self, request: SearchRequest) -> list[Recalled]:
        """Results of `request` from the search process; SearchProcessDown when it is not
        there or went away during the exchange (the caller searches in-process)."""
        result: list[Recalled] = await self._call(("search", request))
        return result

    async def sync(self, tenant: str) -> None:
        """Have the child bring `tenant`'s vector copy up to date now (after a forget)."""
        await self._call(("sync", tenant))

    async def _call(self, message: tuple[str, Any]) -> Any:
        if not self.usable() or self._free is None:
            raise SearchProcessDown("the search process is not running")
        payload = frame(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        free = self._free
        channel = await free.get()
        if channel is None:  # the child exited while this caller waited for a channel
            free.put_nowait(None)  # and every other waiter learns it too
            raise SearchProcessDown("the search process went away")
        exchange = asyncio.ensure_future(self._exchange(channel, free, payload))
        # A caller that gives up must not cut an exchange in half: the answer would stay
        # in the channel for the next caller. The exchange finishes on its own.
        exchange.add_done_callback(_retrieve)
        return await asyncio.shield(exchange)

    async def _exchange(
        self, channel: _Channel, free: asyncio.Queue[_Channel | None], payload: bytes
    ) -> Any:
        try:
            channel.writer.write(payload)
            await channel.writer.drain()
            reply = await self._answer(channel)
        except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
            channel.broken = True
            raise SearchProcessDown("the search process went away mid-search") from exc
        except BaseException:
            # Cut mid-exchange (the loop is closing): its answer may still come, so the
            # channel is never reused; a new child brings fresh ones.
            channel.broken = True
            self._kill()
            raise
        finally:
            if not channel.broken and channel.generation == self._generation:
                free.put_nowait(channel)
        kind, value = pickle.loads(reply)
        if kind != "ok":
            raise SearchFailed(str(value))
        return value

    async def _answer(self, channel: _Channel) -> bytes:
        """The answer on `channel`. While none comes, the child is asked every
        HUNG_AFTER_S whether it is alive (a search may be slow: a cold load of a large
        tenant); one that misses its heartbeat is killed (the supervisor starts a new
        one) and the search goes in-process: a stopped or stuck child never holds recall
        for longer than that."""
        read = asyncio.ensure_future(read_frame_async(channel.reader))
        try:
            while True:
                done, _ = await asyncio.wait({read}, timeout=HUNG_AFTER_S)
                if done:
                    return read.result()
                if not await self._alive():
                    channel.broken = True
                    proc = self._proc
                    log.error(
                        "search process %s answered nothing for %.1f s and missed its"
                        " heartbeat; killing it, searching in-process until it is back",
                        proc.pid if proc is not None else "?",
                        HUNG_AFTER_S,
                    )
                    self._kill()
                    raise SearchProcessDown("the search process stopped answering")
        finally:
            if not read.done():
                read.cancel()

    async def _alive(self) -> bool:
        """Whether the child answers a ping on its heartbeat channel within
        PING_TIMEOUT_S (a thread of its own answers it, whatever the searches do)."""
        beat = self._heartbeat
        if beat is None or beat.broken:
            return False
        async with self._ping_lock:
            if beat.broken:
                return False
            read = asyncio.ensure_future(read_frame_async(beat.reader))
            try:
                beat.writer.write(frame(pickle.dumps(("ping", None))))
                await beat.writer.drain()
                done, _ = await asyncio.wait({read}, timeout=PING_TIMEOUT_S)
                if done and not read.exception():
                    return True
            except OSError:
                pass
            finally:
                if not read.done():
                    read.cancel()
            beat.broken = True  # an answer may still come: the channel is never reused
            return False


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark an abandoned exchange's outcome as seen (no 'never retrieved' warnings)."""
    if not task.cancelled():
        task.exception()
