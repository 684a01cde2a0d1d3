"""One embedding thread shared by recall and learning, recall first, queries batched.

Why: embedding every recall query on its own, in line behind extraction's batches,
made recall the serial step of the proxy: at 16 clients queries queued past the recall
budget and answers went out without memories. Here every text goes through one worker
thread (one ONNX session busy at a time, so recall never fights learning for the cores):

- Recall queries wait in per-tenant queues. When the worker is free it waits at most
  `window_s` after the oldest query arrived (or until `max_batch` are waiting) if the
  previous batch had company (a lone client pays no window), then embeds up to
  `max_batch` of them in ONE call, taken round-robin across tenants
  (the tenant served first rotates): a tenant flooding the proxy gets no more than its
  share of a batch while others wait. Queries arriving while a batch runs form the next.
- An embedder whose query vectors depend on their batch companions (the dynamically
  quantised query copy: `query_batch_shared` is False) gets one tenant's queries per
  call instead, tenants taking turns: no tenant's vector depends on another tenant's
  queries. Its vectors are then cached and shared per tenant too.
- Bulk work (extraction, imports, background recalls of reconciliation) runs when no
  query waits, in chunks of `bulk_chunk` texts, so a waiting recall is delayed by at
  most the chunk in progress. Under sustained recall load, bulk work that has waited
  `bulk_max_wait_s` gets one chunk between query batches, so learning slows but never
  stops (its jobs' leases would otherwise run out while it waits).
- Recent query vectors are kept in an LRU keyed by model and exact text; a query whose
  exact text already waits in the queue shares that waiter's vector (one text, one slot).
- `expected_wait(tenant)` predicts how long a new query of that tenant would wait for
  its vector (the batch in progress, then the texts ahead of it in round-robin order,
  at the measured seconds per text): the caller can choose text-only recall instead of
  a vector that would arrive after its budget (proxy/memory/recall.py says so in the
  response).
- A caller that stops waiting (its recall passed its budget) is dropped from the
  queue or ignored when its batch returns; it never fails the others. An embedder
  error fails every caller of that batch or chunk.

The embedder stays behind the `Embedder` protocol; an embedder may offer
`embed_queries(texts)` to pick a session suited to small latency-bound batches.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memory_core.embedder import Embedder
from memory_core.query_cache import QueryCache

# From bench/embedding.py on the 2-core machine (docs/benchmarks.md): a one-thread
# session takes ~5.6 ms for one short query and ~36 ms for 8 (4.5 ms each), ~62 ms for
# 16: past 8 a batch saves little per text but makes its callers wait longer.
WINDOW_S = 0.002
MAX_BATCH = 8
BULK_CHUNK = 8
CACHE_SIZE = 4096
BULK_MAX_WAIT_S = 1.0  # bulk work waiting this long gets one chunk between query batches
SAME_LENGTH_CHARS = 200  # texts up to this long share a call whatever their lengths
COST_SMOOTHING = 0.2  # weight of the newest batch in the seconds-per-text estimate
# A cost estimate older than this no longer predicts: the next query is embedded and
# measured. Without it one slow batch (a stall of the machine) would make every later
# recall text-only, and a text-only recall embeds nothing, so nothing would re-measure.
COST_STALE_S = 5.0


@dataclass
class _Waiter:
    text: str
    tenant: str
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[np.ndarray]
    arrived: float = field(default_factory=time.monotonic)


@dataclass
class _Bulk:
    texts: list[str]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[np.ndarray]
    parts: list[np.ndarray] = field(default_factory=list)
    done: int = 0
    waiting_since: float = field(default_factory=time.monotonic)


class QueryBatcher:
    """Recall queries batched and served before bulk embedding work (see module doc)."""

    def __init__(
        self,
        embedder: Embedder,
        window_s: float = WINDOW_S,
        max_batch: int = MAX_BATCH,
        bulk_chunk: int = BULK_CHUNK,
        cache_size: int = CACHE_SIZE,
        bulk_max_wait_s: float = BULK_MAX_WAIT_S,
    ) -> None:
        if max_batch < 1 or bulk_chunk < 1:
            raise ValueError("max_batch and bulk_chunk must be at least 1")
        self.embedder = embedder
        self.window_s = window_s
        self.max_batch = max_batch
        self.bulk_chunk = bulk_chunk
        self.bulk_max_wait_s = bulk_max_wait_s
        self._bulk_turn = False  # an overdue bulk chunk just ran: queries go next
        self.cache = QueryCache(cache_size)
        self._queries: OrderedDict[str, deque[_Waiter]] = OrderedDict()
        self._bulk: deque[_Bulk] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._shared = False  # the last batch had more than one caller: worth a window
        self.batches: list[int] = []  # sizes of the last query batches (tests, benchmarks)
        self.seconds_per_text = 0.0  # smoothed cost of one text in a query batch (measured)
        self._measured_at = 0.0  # when seconds_per_text last changed (monotonic)
        self._busy_until = 0.0  # when the batch or chunk in progress should be done
        self.shared_waits = 0  # queries that joined a waiter with the same text
        self.query_texts = 0  # recall queries embedded (cache hits and twins not counted)
        self.query_calls = 0  # embedder calls that embedded them

    # -- callers (event loop side) -------------------------------------------------

    @property
    def tenants_share_calls(self) -> bool:
        """Whether queries of different tenants may be embedded in one call (and share
        a cached vector): only when a query's vector depends on its text alone."""
        return bool(getattr(self.embedder, "query_batch_shared", True))

    def _key(self, text: str, tenant: str) -> tuple[str, ...]:
        if self.tenants_share_calls:
            return (self.embedder.name, text)
        return (self.embedder.name, tenant, text)

    def cached(self, text: str, tenant: str = "") -> np.ndarray | None:
        """The vector `query(text, tenant)` would return from the cache, or None."""
        return self.cache.get(self._key(text, tenant))

    async def query(self, text: str, tenant: str = "") -> np.ndarray:
        """The vector of one recall query: cached, or embedded in the next batch."""
        cached = self.cached(text, tenant)
        if cached is not None:
            return cached
        loop = asyncio.get_running_loop()
        with self._cond:
            self._check_open()
            twin = self._waiting_twin(text, tenant, loop)
            if twin is None:
                waiter = _Waiter(text, tenant, loop, loop.create_future())
                self._queries.setdefault(tenant, deque()).append(waiter)
                self._start()
                self._cond.notify()
            else:
                self.shared_waits += 1
        if twin is None:
            return await waiter.future
        try:
            # shield: this caller giving up must not cancel the twin's own caller
            vector = await asyncio.shield(twin.future)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if twin.future.cancelled() and task is not None and not task.cancelling():
                return await self.query(text, tenant)  # its caller gave up, this one not
            raise
        return vector.copy()

    def _waiting_twin(
        self, text: str, tenant: str, loop: asyncio.AbstractEventLoop
    ) -> _Waiter | None:
        """Under the lock: a live queued waiter with this exact text on this loop (of
        this tenant, when tenants do not share calls)."""
        queues = (
            self._queries.values()
            if self.tenants_share_calls
            else [self._queries.get(tenant, deque())]
        )
        for queue in queues:
            for waiter in queue:
                if waiter.text == text and waiter.loop is loop and not waiter.future.done():
                    return waiter
        return None

    def expected_wait(self, tenant: str = "", text: str | None = None) -> float:
        """Seconds a new query of `tenant` would wait for its vector, its own embedding
        included: what is left of the work in progress, then every text served before it
        (round-robin: in the turns this tenant needs for its queue and the new query,
        each other tenant sends as many of its own), at the measured seconds per text.
        0 until a batch has been measured, and for a text whose vector is cached; only
        the work in progress when the estimate is older than COST_STALE_S (the next
        query then re-measures it)."""
        if text is not None and self._key(text, tenant) in self.cache:
            return 0.0
        unit = 1 if self.tenants_share_calls else self.batch_limit  # texts a tenant sends a turn
        with self._cond:
            own = len(self._queries.get(tenant, ()))
            sent = (own // unit + 1) * unit
            ahead = own + sum(
                min(len(queue), sent) for name, queue in self._queries.items() if name != tenant
            )
            busy = max(0.0, self._busy_until - time.monotonic())
        if time.monotonic() - self._measured_at > COST_STALE_S:
            return busy  # stale estimate: let this query be embedded and re-measure
        return busy + (ahead + 1) * self.seconds_per_text

    async def bulk(self, texts: list[str]) -> np.ndarray:
        """Vectors for `texts` (extraction, imports), embedded when no query waits."""
        if not texts:
            return np.zeros((0, self.embedder.dim), dtype=np.float32)
        loop = asyncio.get_running_loop()
        job = _Bulk(list(texts), loop, loop.create_future())
        with self._cond:
            self._check_open()
            self._bulk.append(job)
            self._start()
            self._cond.notify()
        return await job.future

    def stats(self) -> dict[str, int]:
        """Counters since start, for metrics: texts per call is the batching achieved."""
        return {
            "query_texts": self.query_texts,
            "query_calls": self.query_calls,
            "cache_hits": self.cache.hits,
            "shared_waits": self.shared_waits,
        }

    def close(self) -> None:
        """Stop the worker once the work already queued is done."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the embedding queue is closed")

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="memrelay-embed", daemon=True)
            self._thread.start()

    # -- the worker ----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                batch, chunk = self._next_work()
                if batch is None and chunk is None:
                    return
            if batch:
                self._embed_batch(batch)
            elif chunk is not None:
                self._embed_chunk(*chunk)

    def _next_work(self) -> tuple[list[_Waiter] | None, tuple[_Bulk, list[str]] | None]:
        """Under the lock: the next query batch, else the next bulk chunk; (None, None)
        when closed and drained."""
        while True:
            self._drop_abandoned()
            if self._bulk and self._queries and not self._bulk_turn:
                job = self._bulk[0]
                if time.monotonic() - job.waiting_since >= self.bulk_max_wait_s:
                    self._bulk_turn = True  # one chunk, then queries again
                    job.waiting_since = time.monotonic()
                    return None, (job, job.texts[job.done : job.done + self.bulk_chunk])
            if self._queries:
                oldest = min(q[0].arrived for q in self._queries.values())
                wait = oldest + self.window_s - time.monotonic()
                crowded = self._shared and self._pending() < self.batch_limit
                if wait > 0 and crowded and not self._closed:
                    self._cond.wait(wait)
                    continue
                self._bulk_turn = False
                return self._take_batch(), None
            if self._bulk:
                job = self._bulk[0]
                job.waiting_since = time.monotonic()
                texts = job.texts[job.done : job.done + self.bulk_chunk]
                return None, (job, texts)
            if self._closed:
                return None, None
            self._cond.wait()

    @property
    def batch_limit(self) -> int:
        """Queries taken in one call: `max_batch`, or fewer when the embedder says more
        gain nothing (`query_batch`). A smaller call lets a waiting tenant's query go
        sooner (tenants take turns)."""
        return max(1, min(self.max_batch, getattr(self.embedder, "query_batch", self.max_batch)))

    def _pending(self) -> int:
        return sum(len(q) for q in self._queries.values())

    def _drop_abandoned(self) -> None:
        for tenant in list(self._queries):
            queue = self._queries[tenant]
            live = deque(w for w in queue if not w.future.done())
            if live:
                self._queries[tenant] = live
            else:
                del self._queries[tenant]

    def _take_batch(self) -> list[_Waiter]:
        """Up to max_batch waiters, one per tenant per round; served tenants move last.
        When tenants do not share calls: up to max_batch of the next tenant's."""
        limit = self.batch_limit
        if not self.tenants_share_calls:
            return self._take(next(iter(self._queries)), limit)
        batch: list[_Waiter] = []
        while self._queries and len(batch) < limit:
            for tenant in list(self._queries):
                if len(batch) >= limit:
                    break
                batch += self._take(tenant, 1)
        return batch

    def _take(self, tenant: str, count: int) -> list[_Waiter]:
        """Up to `count` of `tenant`'s waiters; the tenant then moves last, or leaves."""
        queue = self._queries[tenant]
        taken = [queue.popleft() for _ in range(min(count, len(queue)))]
        if queue:
            self._queries.move_to_end(tenant)
        else:
            del self._queries[tenant]
        return taken

    def _embed_batch(self, batch: list[_Waiter]) -> None:
        texts = list(dict.fromkeys(w.text for w in batch))  # identical texts once
        self._shared = len(batch) > 1
        self.batches = [*self.batches[-999:], len(texts)]
        embed = getattr(self.embedder, "embed_queries", None) or self.embedder.embed
        pairs: list[tuple[str, np.ndarray]] = []
        started = time.monotonic()
        self._busy_until = started + len(texts) * self.seconds_per_text
        try:
            for group in length_groups(texts):
                vectors = embed(group)
                if len(vectors) != len(group):
                    raise RuntimeError(f"embedder gave {len(vectors)} vectors for {len(group)}")
                pairs += zip(group, vectors, strict=True)
        except Exception as exc:  # every waiter of the batch learns of it
            _settle_all([(w.loop, w.future, None, exc) for w in batch])
            return
        finally:
            self._busy_until = 0.0
        self._measured((time.monotonic() - started) / len(texts))
        self.query_texts += len(texts)
        self.query_calls += len(length_groups(texts))
        by_text = {text: np.array(vector, dtype=np.float32) for text, vector in pairs}
        for waiter in batch:
            self.cache.put(self._key(waiter.text, waiter.tenant), by_text[waiter.text])
        _settle_all([(w.loop, w.future, by_text[w.text].copy(), None) for w in batch])

    def _measured(self, seconds_per_text: float) -> None:
        self._measured_at = time.monotonic()
        if self.seconds_per_text == 0.0:
            self.seconds_per_text = seconds_per_text
        else:
            self.seconds_per_text += COST_SMOOTHING * (seconds_per_text - self.seconds_per_text)

    def _embed_chunk(self, job: _Bulk, texts: list[str]) -> None:
        if job.future.done():  # the caller gave up: skip the rest of its texts
            with self._cond:
                self._remove(job)
            return
        self._busy_until = time.monotonic() + len(texts) * self.seconds_per_text
        try:
            vectors = np.asarray(self.embedder.embed(texts), dtype=np.float32)
        except Exception as exc:
            with self._cond:
                self._remove(job)
            _settle(job.loop, job.future, None, exc)
            return
        finally:
            self._busy_until = 0.0
        job.parts.append(vectors)
        job.done += len(texts)
        if job.done >= len(job.texts):
            with self._cond:
                self._remove(job)
            _settle(job.loop, job.future, np.concatenate(job.parts), None)

    def _remove(self, job: _Bulk) -> None:
        try:
            self._bulk.remove(job)
        except ValueError:
            pass


def length_groups(texts: list[str]) -> list[list[str]]:
    """Texts of similar length together: a batch is padded to its longest text, so one
    long query would otherwise make every short one in its batch cost as much."""
    groups: list[list[str]] = []
    for text in sorted(texts, key=len):
        if groups and len(text) <= max(2 * len(groups[-1][0]), SAME_LENGTH_CHARS):
            groups[-1].append(text)
        else:
            groups.append([text])
    return groups


Outcome = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Any, BaseException | None]


def _settle(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    value: Any,
    error: BaseException | None,
) -> None:
    _settle_all([(loop, future, value, error)])


def _settle_all(outcomes: list[Outcome]) -> None:
    """Resolve callers' futures on their own loops (one wake-up per loop), skipping any
    cancelled meanwhile."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Outcome]] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome[0], []).append(outcome)

    def apply(items: list[Outcome]) -> None:
        for _, future, value, error in items:
            if future.done():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(apply, items)
        except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
            pass
