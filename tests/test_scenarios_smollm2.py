"""The scenario suite against the embedded default model (SmolLM2-135M in llama.cpp) as
the extraction model. Chat answers stay scripted, so only extraction and judging are
the small model's. The score is reported (printed, and written to the file named by
MEMRELAY_SCENARIO_REPORT), not asserted: a 135M model is not expected to extract
well. What is asserted is that explicit requests ("remember that ...", "forget ...")
work whatever the model.

By default (and so in CI) only the explicit-request scenarios are played: each takes
tens of seconds on 2 cores, and the whole suite takes most of an hour. The full run,
whose score the README reports:
  MEMRELAY_SMOLLM2_ALL_SCENARIOS=1 PYTHONPATH=$PWD python -m pytest \
      tests/test_scenarios_smollm2.py -m llm -s
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from pathlib import Path

import pytest

from memory_core import SQLiteStore
from proxy.local_llm import LocalLlamaServer
from proxy.wiring import build_app
from tests.perfect_model import PerfectModel
from tests.scenario_runner import play, report
from tests.scenarios import SCENARIOS
from tests.servers import ServedApp
from tests.test_scenarios import scenario_settings

pytestmark = [pytest.mark.llm, pytest.mark.timeout(3600)]


def test_scenarios_on_the_embedded_default_model(served_fake, embedder, tmp_path):
    fake, served = served_fake
    llama = LocalLlamaServer(ctx=8192, parallel=2)  # extraction and judge prompts each keep a slot
    asyncio.run(llama.start())
    fake.reset()
    fake.responder = model = PerfectModel(extraction=False)  # chat only; extraction is llama's
    settings = scenario_settings(
        tmp_path / "smollm2.db",
        served.url,
        extraction_url=llama.url,
        extraction_model="smollm2",
        extraction_max_tokens=300,
        extraction_timeout=600,
    )
    results = []
    try:
        with ServedApp(build_app(settings, store=SQLiteStore(settings.db, embedder))) as server:
            # Explicit requests first: they are what must work whatever the model.
            order = sorted(range(len(SCENARIOS)), key=lambda i: not SCENARIOS[i].explicit)
            if not os.environ.get("MEMRELAY_SMOLLM2_ALL_SCENARIOS"):
                order = [i for i in order if SCENARIOS[i].explicit]
            for index in order:
                scenario = SCENARIOS[index]
                tenant = f"smol-{index}-{re.sub(r'[^a-z0-9]+', '-', scenario.name)[:40]}"
                started = time.monotonic()
                results.append(play(server.url, model, scenario, tenant, job_timeout=300))
                took = time.monotonic() - started
                print(f"{results[-1].ok!s:5} {took:6.1f}s {scenario.name}", file=sys.stderr)
    finally:
        fake.reset()
        asyncio.run(llama.close())
    text = report(results)
    print("\nSmolLM2-135M as the extraction model:\n" + text)
    if os.environ.get("MEMRELAY_SCENARIO_REPORT"):
        Path(os.environ["MEMRELAY_SCENARIO_REPORT"]).write_text(text + "\n")
    explicit = [r for r, i in zip(results, order, strict=True) if SCENARIOS[i].explicit]
    assert explicit and all(r.ok for r in explicit), text
