"""Recall outcomes per tenant, for the inspector's stats page.

A chat interceptor beside the recall interceptor: once the upstream answered (interceptors'
`before` hooks run side by side, so recall's status is only sure then), it reads the
recall status put on the response and counts it under the request's tenant (in this
process, since it started). The ok-rate is the share of recalls that finished in time
and without error (`ok` or `empty`), as the benchmarks count it.
"""

from __future__ import annotations

from collections import Counter

from proxy.memory.scoping import SCOPE_KEY, MemoryScope
from proxy.relay.exchange import Exchange
from proxy.relay.hooks import ChatContext

STATUS_HEADER = b"x-memrelay-recall-status"
MAX_TENANTS = 10_000


class RecallTally:
    def __init__(self) -> None:
        self.by_tenant: dict[str, Counter[str]] = {}

    async def before(self, ctx: ChatContext) -> None:
        return None

    def response_started(self, ctx: ChatContext, status: int) -> None:
        scope = ctx.state.get(SCOPE_KEY)
        recalled = next((v for k, v in ctx.response_headers if k == STATUS_HEADER), None)
        if not isinstance(scope, MemoryScope) or recalled is None:
            return
        counts = self.by_tenant.get(scope.tenant)
        if counts is None:
            if len(self.by_tenant) >= MAX_TENANTS:
                return
            counts = self.by_tenant[scope.tenant] = Counter()
        counts[recalled.decode("latin-1")] += 1

    def wants_answer(self, ctx: ChatContext) -> bool:
        return False

    async def after(self, ctx: ChatContext, exchange: Exchange) -> None:
        return None

    def of(self, tenant: str) -> dict[str, object]:
        counts = dict(self.by_tenant.get(tenant, Counter()))
        ran = sum(n for status, n in counts.items() if status != "off")
        good = counts.get("ok", 0) + counts.get("empty", 0)
        return {"counts": counts, "recalls": ran, "ok_rate": good / ran if ran else None}
