"""The learning draft is written while recall runs, not after it.

Both hooks run before the request goes upstream; run one after the other, the draft's
SQLite write added its time to every answer's first byte. The store below recalls only
once it can see the request's draft in the jobs table (its own real reader on the real
SQLite file): if the draft waited for recall, recall would wait out its whole budget.
"""

from __future__ import annotations

import asyncio

import openai

from memory_core import SQLiteStore

FACT = "The user keeps bees in the garden"


class RecallAfterDraft(SQLiteStore):
    """Recall that first waits (within its budget) for a job draft to exist."""

    async def recall(self, query):
        while True:
            if await self.run_read(lambda c: c.execute("SELECT count(*) FROM jobs").fetchone()[0]):
                break
            await asyncio.sleep(0.01)  # polls the real table: no event to wait on
        return await super().recall(query)


def test_the_draft_is_written_while_recall_runs(fake, memory_proxy):
    server, seed = memory_proxy(store_class=RecallAfterDraft, recall_budget_ms=10_000)
    seed.add("acme", "default", FACT)
    client = openai.OpenAI(
        base_url=server.url + "/v1",
        api_key="sk-test",
        max_retries=0,
        default_headers={"X-Memrelay-Tenant": "acme"},
    )
    response = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "What about my bees?"}], stream=True
    )
    for _ in response.parse():
        pass
    assert response.headers["x-memrelay-recall-status"] == "ok"
    assert response.headers["x-memrelay-memory-status"] == "queued"
    sent = fake.chat_requests()[-1].json()["messages"]
    assert FACT in sent[0]["content"]  # recall's injection reached upstream
