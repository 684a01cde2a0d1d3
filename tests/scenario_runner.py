"""Plays a scenario (tests/scenarios.py) through memrelay with the official openai SDK,
waits for each exchange to be learned, and judges the system message the upstream
received for the final question."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from tests.perfect_model import PerfectModel
from tests.scenarios import Scenario

WRITE, READ = "X-Memrelay-Write-Space", "X-Memrelay-Read-Spaces"


class AdminAPI:
    """The admin API of one tenant, as the scenario checks use it."""

    def __init__(self, url: str, tenant: str) -> None:
        self.http = httpx.Client(
            base_url=url + "/memrelay/v1", headers={"X-Memrelay-Tenant": tenant}, timeout=30
        )

    def memories(self, status: str = "active,superseded,forgotten,expired") -> list[dict]:
        response = self.http.get("/memories", params={"status": status, "limit": 1000})
        response.raise_for_status()
        return response.json()["data"]

    def events(self) -> list[dict]:
        return self.http.get("/events", params={"limit": 1000}).json()["data"]

    def export_text(self) -> str:
        return self.http.get("/export").text

    def jobs(self) -> dict[str, int]:
        return self.http.get("/stats").json()["jobs"]

    def wait_jobs(self, count: int, timeout: float) -> dict[str, int]:
        """Until `count` jobs of this tenant are done or dead."""
        deadline = time.monotonic() + timeout
        while True:
            jobs = self.jobs()
            if jobs["done"] + jobs["dead"] >= count and jobs["pending"] + jobs["leased"] == 0:
                return jobs
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs not finished within {timeout}s: {jobs}")
            time.sleep(0.05)

    def close(self) -> None:
        self.http.close()


@dataclass
class Result:
    scenario: str
    ok: bool
    problems: list[str]
    system: str


def play(
    url: str, model: PerfectModel, scenario: Scenario, tenant: str, job_timeout: float = 60
) -> Result:
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, timeout=120)
    api = AdminAPI(url, tenant)
    problems: list[str] = []
    try:
        messages: list[dict[str, Any]] = []
        for number, turn in enumerate(scenario.turns, start=1):
            headers = {"X-Memrelay-Tenant": tenant}
            if turn.write:
                headers[WRITE] = turn.write
            if turn.read:
                headers[READ] = turn.read
            messages.append({"role": "user", "content": turn.user})
            reply = client.chat.completions.create(
                model="m", messages=messages, extra_headers=headers, max_tokens=32
            )
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            jobs = api.wait_jobs(number, job_timeout)
            if jobs["dead"]:
                problems.append(f"{jobs['dead']} dead jobs")
        if scenario.wait_s:
            time.sleep(scenario.wait_s)
        headers = {"X-Memrelay-Tenant": tenant, "X-Memrelay-Memory": "read"}
        if scenario.read:
            headers[READ] = scenario.read
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": scenario.question}],
            extra_headers=headers,
            max_tokens=32,
        )
        system = _system_for(model, scenario.question)
        for text in scenario.expect:
            if text not in system:
                problems.append(f"missing {text!r}")
        for text in scenario.absent:
            if text.casefold() in system.casefold():
                problems.append(f"stale {text!r} injected")
        if scenario.check is not None:
            try:
                scenario.check(api)
            except AssertionError as exc:
                problems.append(f"check failed: {exc}")
    finally:
        api.close()
        client.close()
    return Result(scenario.name, not problems, problems, system)


def _system_for(model: PerfectModel, question: str) -> str:
    with model.lock:
        bodies = list(model.chat_bodies)
    for body in reversed(bodies):
        messages = body["messages"]
        if messages[-1].get("content") == question:
            first = messages[0]
            return first["content"] if first.get("role") == "system" else ""
    raise AssertionError(f"the upstream never received {question!r}")


def report(results: list[Result]) -> str:
    passed = sum(r.ok for r in results)
    lines = [f"{passed}/{len(results)} scenarios right"]
    for r in results:
        lines.append(f"{'ok  ' if r.ok else 'FAIL'} {r.scenario}: {json.dumps(r.problems)}")
    return "\n".join(lines)
