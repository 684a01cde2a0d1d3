"""The benchmark's server processes on loopback: the paced fake upstream, `memrelay
serve`, and the LiteLLM proxy from a virtual environment of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.servers import free_port

# 1.107.0 was a compromised release; 1.108+ need a litellm-proxy-extras the index lacks.
LITELLM_VERSION = "1.106.12"
LITELLM_KEY = "sk-memrelay-bench-" + "7f3a9c2e5b8d4f1a6c0e9b2d7a4f8c3e"


def litellm_venv(root: Path) -> Path | None:
    """bench/.litellm-venv with `litellm[proxy]`, created on first use (about 2 minutes)."""
    venv = root / "bench" / ".litellm-venv"
    exe = venv / "bin" / "litellm"
    if not exe.exists():
        print(f"  installing litellm[proxy]=={LITELLM_VERSION} into {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        done = subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
             f"litellm[proxy]=={LITELLM_VERSION}"],
            check=False,
        )  # fmt: skip
        if done.returncode != 0 or not exe.exists():
            print("  LiteLLM could not be installed; its column is left out", flush=True)
            return None
    return exe


class Process:
    """A server process, waited for until `ready_path` answers."""

    def __init__(self, argv: list[str], url: str, ready_path: str, env: dict[str, str]) -> None:
        self.url = url
        # A file, not a pipe: a pipe nobody reads fills up (64 KiB of warnings under
        # overload) and the server then blocks on its next log line.
        self.log_path = Path(tempfile.mkstemp(prefix="memrelay-bench-", suffix=".log")[1])
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen(
            argv, env={**os.environ, **env}, stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.log_path.read_text()[-3000:]
                raise RuntimeError(f"{argv[0]} exited: {err}")
            try:
                if httpx.get(url + ready_path, timeout=2).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{argv[0]} did not start")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()
        self.log_path.unlink(missing_ok=True)


def start_fake() -> Process:
    port = free_port()
    return Process(
        [sys.executable, "-m", "bench.fake_server", str(port)],
        f"http://127.0.0.1:{port}",
        "/v1/models",
        {},
    )


def start_memrelay(db: Path, upstream: str) -> Process:
    port = free_port()
    exe = str(Path(sys.executable).with_name("memrelay"))
    return Process(
        [exe, "serve"],
        f"http://127.0.0.1:{port}",
        "/memrelay/readyz",
        {
            "MEMRELAY_DB": str(db),
            "MEMRELAY_UPSTREAM_URL": upstream,
            "MEMRELAY_PORT": str(port),
            "MEMRELAY_EXTRACTION_WORKERS": "0",
            "MEMRELAY_LOG_LEVEL": "warning",
        },
    )


def start_litellm(exe: Path, upstream: str, work: Path) -> Process:
    port = free_port()
    config = work / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: fake-model\n"
        "    litellm_params:\n"
        "      model: openai/fake-model\n"
        f"      api_base: {upstream}/v1\n"
        "      api_key: sk-fake\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
        "  telemetry: false\n"
        "general_settings:\n"
        f"  master_key: {LITELLM_KEY}\n"  # it refuses to start without one
    )
    return Process(
        [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        f"http://127.0.0.1:{port}",
        "/health/liveliness",
        {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the price list from GitHub
            "LITELLM_LOG": "ERROR",
            "NO_DOCKER": "1",
        },
    )
