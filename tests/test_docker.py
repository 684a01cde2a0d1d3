"""What can be checked of the Docker files without a Docker engine (none runs here):
the compose file parses, every path the Dockerfile copies exists, the build-time model
steps work, and the entrypoint command serves in a plain venv."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()


def instructions(name: str) -> list[str]:
    """Arguments of every `NAME ...` instruction, with continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.startswith(name + " ")]


def test_compose_file_parses_and_is_consistent():
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    services = compose["services"]
    build = services["memrelay"]["build"]
    assert (
        ROOT / "docker" / build["context"] / build["dockerfile"]
    ).resolve() == ROOT / "docker" / "Dockerfile"
    assert services["llamacpp"]["profiles"] == ["llamacpp"]
    assert services["memrelay-llamacpp"]["environment"]["MEMRELAY_UPSTREAM_URL"].startswith(
        "http://llamacpp:"
    )
    replicas = [s for name, s in services.items() if name.startswith("memrelay-replica-")]
    assert len(replicas) == 2
    for replica in replicas:
        assert replica["profiles"] == ["postgres"]
        assert replica["environment"]["MEMRELAY_DB"].startswith("postgresql://")
        assert "@postgres:5432/" in replica["environment"]["MEMRELAY_DB"]
        assert replica["depends_on"]["postgres"]["condition"] == "service_healthy"
    balancer = (ROOT / "docker" / "nginx.conf").read_text()
    for name in ("memrelay-replica-1", "memrelay-replica-2"):
        assert f"server {name}:8421;" in balancer
    assert "proxy_buffering off;" in balancer  # streams pass through unbuffered
    used = {
        v.split(":")[0]
        for s in services.values()
        for v in s.get("volumes", [])
        if not v.startswith(".")
    }
    assert used <= set(compose["volumes"])
    for service in services.values():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), "published ports stay on loopback while insecure"


def test_every_copied_path_exists():
    sources = []
    for args in instructions("COPY"):
        if args.startswith("--from"):
            continue
        *paths, _target = shlex.split(args)
        sources += paths
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source


def test_image_runs_as_non_root_with_volume_and_healthcheck():
    assert instructions("USER")[-1] == "memrelay"
    assert "/data" in instructions("VOLUME")[0]
    assert instructions("HEALTHCHECK") and "/memrelay/healthz" in instructions("HEALTHCHECK")[0]
    assert len(re.findall(r"^FROM ", DOCKERFILE, re.MULTILINE)) == 2  # multi-stage


def test_build_time_model_steps_work_here(tmp_path):
    """The RUN step's python -c snippets (bake the embedding folder, find the GGUF)."""
    run = instructions("RUN")[0]
    snippets = re.findall(r'python -c "([^"]+)"', run)
    assert len(snippets) == 2
    for snippet in snippets:
        code = snippet.replace("/opt/memrelay-models", str(tmp_path))
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)
    assert (tmp_path / "all-MiniLM-L6-v2-int8" / "model.onnx").exists()


@pytest.mark.llm
def test_entrypoint_serves_in_a_plain_venv(tmp_path):
    entrypoint = json.loads(instructions("ENTRYPOINT")[0])
    assert entrypoint == ["memrelay", "serve"]
    env_line = instructions("ENV")[0]
    env = dict(pair.split("=", 1) for pair in shlex.split(env_line) if "=" in pair)
    import socket

    from tests.servers import ServedApp  # noqa: F401  (same free-port approach below)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env.update(
        {
            "MEMRELAY_DB": str(tmp_path / "memrelay.db"),
            "MEMRELAY_HOST": "127.0.0.1",
            "MEMRELAY_PORT": str(port),
            "MEMRELAY_EMBEDDING_MODEL_DIR": "",
            "PATH": os.environ["PATH"],
        }
    )
    env.pop("MEMRELAY_EMBEDDING_MODEL_DIR")
    command = [str(Path(sys.executable).parent / entrypoint[0]), *entrypoint[1:]]
    process = subprocess.Popen(
        command, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if (
                    httpx.get(f"http://127.0.0.1:{port}/memrelay/healthz", timeout=1).status_code
                    == 200
                ):
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise AssertionError(process.stdout.read1().decode() if process.stdout else "no output")
        assert httpx.get(f"http://127.0.0.1:{port}/memrelay/readyz", timeout=10).status_code == 200
        health = instructions("HEALTHCHECK")[0].split("CMD ", 1)[1]
        check = json.loads(health)
        code = check[2].replace("127.0.0.1:8421", f"127.0.0.1:{port}")
        subprocess.run([sys.executable, "-c", code], check=True, timeout=10)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
    output = process.stdout.read().decode() if process.stdout else ""
    # uvicorn shuts down gracefully, then re-raises SIGTERM to exit with its status.
    assert process.returncode in (0, -signal.SIGTERM), output
    assert "Application shutdown complete" in output
