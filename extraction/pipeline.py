"""What one extraction job does with one exchange, in order.

1. Explicit requests in the user's message ("remember that ...", "forget ...", see
   `extraction/commands.py`) are applied first, without any model.
2. The memories related to the exchange, in every space the request can read, are
   recalled and numbered (m1, m2, ...).
3. The model is shown the exchange, its context (the assistant turn the user answered,
   earlier turns, today's date) and those memories; it proposes facts (add / update /
   same, against the ids), ids no longer true, and ids to forget.
4. `Reconciler` applies each proposal under its rules and guards.
A model that fails with bad output after explicit requests were applied does not fail
the job (what the user asked for is done); a transient failure is retried, and a
retried job changes nothing twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from extraction.commands import parse_commands
from extraction.entities import EntityExtractor
from extraction.facts import Extraction, Fact, read_extraction
from extraction.forget_words import stems
from extraction.llm import LLMClient, LLMError, TransientLLMError
from extraction.prompts import FACT_SCHEMA, ExchangeInput, extract_messages
from extraction.reconcile import LLMContext, Outcome, Reconciler
from memory_core.model import validate_id

log = logging.getLogger("memrelay.extraction")
MAX_SPACES = 64
COMMAND_CONFIDENCE = 0.9


def readable_spaces(write_space: str, context: dict[str, Any]) -> list[str]:
    """The write space first, then the request's read spaces (valid ids only)."""
    spaces = [write_space]
    for space in context.get("read_spaces") or []:
        try:
            validate_id(space, "space")
        except ValueError:
            continue
        if space not in spaces:
            spaces.append(space)
    return spaces[:MAX_SPACES]


def exchange_input(payload: dict[str, Any], fallback_time: float | None) -> ExchangeInput:
    context = payload.get("context") or {}
    turns = [
        {"role": str(t.get("role")), "text": str(t.get("text"))}
        for t in context.get("earlier_turns") or []
        if isinstance(t, dict)
    ]
    at = payload.get("time") or fallback_time or time.time()
    return ExchangeInput(
        user=str(payload.get("user") or ""),
        assistant=str(payload.get("assistant") or ""),
        previous_assistant=str(context.get("previous_assistant") or ""),
        earlier_turns=turns,
        at=float(at),
    )


async def learn(
    job_id: str,
    tenant: str,
    space: str,
    payload: dict[str, Any],
    llm: LLMClient,
    reconciler: Reconciler,
    context: LLMContext,
    entities: EntityExtractor | None = None,
    created_at: float | None = None,
) -> dict[str, Any]:
    """Extract and reconcile one exchange; returns the job's result."""
    exchange = exchange_input(payload, created_at)
    spaces = readable_spaces(space, payload.get("context") or {})
    provenance = {
        "job_id": job_id,
        "request_id": payload.get("request_id"),
        "model": payload.get("model"),
        "time": payload.get("time"),
    }
    outcomes: list[Outcome] = []
    commands = parse_commands(exchange.user)
    for content, kind in commands.remember:
        fact = Fact(content, kind, confidence=COMMAND_CONFIDENCE, stated_by="user")
        fact.observed_at = exchange.at
        prov = {**provenance, "stated_by": "user", "via": "command"}
        outcomes.append(await reconciler.apply(tenant, space, fact, prov, context, spaces=spaces))
    for words in commands.forget:
        outcomes += await reconciler.forget_request(tenant, spaces, words, context, job_id)

    query = "\n".join(t for t in (exchange.user, exchange.previous_assistant) if t)
    shown = await reconciler.related(tenant, spaces, query)
    model_error = None
    try:
        answer = await llm.complete_json(
            extract_messages(exchange, shown=shown),
            FACT_SCHEMA,
            model=context.model,
            credentials=context.credentials,
        )
        extraction = read_extraction(answer, exchange.at)
    except (LLMError, ValueError) as exc:
        if isinstance(exc, TransientLLMError) or not (commands.remember or commands.forget):
            raise
        log.info("job %s: model output unusable after explicit requests were applied", job_id)
        extraction, model_error = Extraction(), "the model gave no usable answer"
    if entities is not None:
        for fact in extraction.facts:
            fact.entities = await asyncio.to_thread(entities.entities, fact.content)

    forgotten_words = [stems(w) for w in commands.forget]
    for fact in extraction.facts:
        if fact.expires_at is not None and fact.expires_at <= (exchange.at or time.time()):
            outcomes.append(Outcome("skipped", reason="its expiry had passed"))
            continue
        if any(words and words <= stems(fact.content) for words in forgotten_words):
            outcomes.append(Outcome("skipped", reason="the user asked to forget it"))
            continue
        prov = {**provenance, "stated_by": fact.stated_by}
        fact.observed_at = fact.observed_at if fact.observed_at is not None else exchange.at
        outcomes.append(
            await reconciler.apply(tenant, space, fact, prov, context, spaces=spaces, shown=shown)
        )
    for short_id in extraction.delete:
        if short_id in shown:
            outcomes.append(await reconciler.retire(tenant, shown[short_id], job_id))
    requested = {w.casefold() for w in commands.forget}
    for item in extraction.forget:
        if item in shown:
            outcomes.append(await reconciler.forget_memory(tenant, shown[item], job_id))
        elif item.casefold() not in requested:
            outcomes += await reconciler.forget_request(tenant, spaces, item, context, job_id)
    result: dict[str, Any] = {
        "facts": len(extraction.facts),
        "skipped": extraction.skipped,
        "commands": len(commands.remember) + len(commands.forget),
        "spaces": spaces,
        "outcomes": [o.as_dict() for o in outcomes],
    }
    if model_error:
        result["model_error"] = model_error
    return result
