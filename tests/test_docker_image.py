"""The Docker image, built and started without a Docker engine (none runs here).

The image's filesystem is built from a minimal Debian trixie root (debootstrap, from
Debian's packages; cached between runs) by running docker/Dockerfile's instructions in
chroots (tests/dockerfile_chroot.py). The base image, python:3.13-slim-trixie, is
Debian trixie plus a CPython 3.13 build linked against Debian's libraries; the root
stands in for it with Debian trixie's own python3 (CPython 3.13, the same libsqlite3
3.46 with loadable extensions, the same missing libgomp1): what the image must add, the
Dockerfile must add. Then the entrypoint runs as `docker run IMAGE` would (as root, in
a network namespace of its own, with the image's ENV) and the test asks, with the
image's own HEALTHCHECK command, until `memrelay serve` answers /memrelay/healthz, then
/memrelay/readyz on the embedded llama.cpp model.

Slow (minutes from cold: debootstrap, then pip installs memrelay's wheels); needs root
(chroot, mount, unshare) and the package registries, as CI has.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.debian_root import base_root, cache_root
from tests.dockerfile_chroot import ChrootBuild, Stage, mounted

ROOT = Path(__file__).resolve().parent.parent
PORT = 8499  # inside the image's own network namespace: any port works

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(os.geteuid() != 0, reason="chroot, mount and unshare need root"),
]


def in_image(stage: Stage, pid: int | None, command: list[str], env: dict[str, str], **kw):
    """Run `command` in the image (in the server's network namespace when `pid` is given)."""
    full = {**stage.env, "HOME": "/root", **env}
    enter = ["nsenter", f"--target={pid}", "--net"] if pid else []
    return subprocess.run(
        [
            *enter,
            "chroot",
            *kw.pop("user", []),
            str(stage.root),
            "/usr/bin/env",
            "-i",
            *(f"{k}={v}" for k, v in full.items()),
            *command,
        ],
        capture_output=True,
        text=True,
        timeout=kw.pop("timeout", 30),
        **kw,
    )


@pytest.fixture(scope="module")
def image():
    cache_root().mkdir(parents=True, exist_ok=True)
    log = cache_root() / "last-image-build.log"  # kept for reading after a failure
    log.write_text("")
    base = base_root(log)
    work = Path(cache_root()) / f"image-build-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    build = ChrootBuild(ROOT / "docker" / "Dockerfile", ROOT, base, work, log)
    try:
        try:
            stage = build.build()
        except subprocess.CalledProcessError as exc:
            raise AssertionError(f"{exc}\n{log.read_text()[-4000:]}") from exc
        yield stage, log
    finally:
        mounts = Path("/proc/mounts").read_text()
        assert str(work) not in mounts, "a mount is left inside the build folder"
        shutil.rmtree(work, ignore_errors=True)


def test_image_starts_with_plain_docker_run_and_is_ready_on_the_embedded_model(image):
    stage, _log = image
    assert stage.user == "root" and stage.entrypoint == ["memrelay-entrypoint"]
    assert stage.cmd == ["serve"] and "/data" in stage.volumes
    data = stage.root / "data"
    assert data.stat().st_uid == 10001
    os.chown(data, 0, 0)  # as a host folder mounted on /data would be: not the image's user
    env = {"MEMRELAY_PORT": str(PORT)}  # the configured port, which the HEALTHCHECK must use
    full = {**stage.env, "HOME": "/root", **env}
    with mounted(stage.root):
        server = subprocess.Popen(
            [
                "unshare",
                "--net",
                "sh",
                "-c",
                'ip link set lo up && exec "$@"',
                "sh",
                "chroot",
                str(stage.root),
                "/usr/bin/env",
                "-i",
                *(f"{k}={v}" for k, v in full.items()),
                "/bin/sh",
                "-c",
                f'cd {stage.workdir} && exec "$@"',
                "sh",
                *stage.entrypoint,
                *stage.cmd,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 240
            healthy = ready = None
            while time.monotonic() < deadline and server.poll() is None:
                healthy = in_image(stage, server.pid, stage.healthcheck, env)
                if healthy.returncode == 0:
                    ready = in_image(
                        stage,
                        server.pid,
                        [
                            "python",
                            "-c",
                            "import urllib.request as u; print(u.urlopen("
                            f"'http://127.0.0.1:{PORT}/memrelay/readyz', timeout=20).status)",
                        ],
                        env,
                    )
                    if ready.returncode == 0:
                        break
                time.sleep(2)
            assert server.poll() is None, server.stdout.read().decode() if server.stdout else ""
            assert healthy is not None and healthy.returncode == 0, healthy
            assert ready is not None and ready.stdout.strip() == "200", ready
            assert (data / "keys.json").stat().st_uid == 10001
            assert (data / "memrelay.db").stat().st_uid == 10001
            assert data.stat().st_uid == 10001
            # Debian trixie's sqlite3 loads extensions and is new enough: no pysqlite3.
            module = in_image(
                stage,
                None,
                ["python", "-c", "import memory_core.sqlite.db as d; print(d.MODULE_NOTE)"],
                env,
            )
            assert module.stdout.strip() == "the standard sqlite3 module", module
            # Another uid, as with `docker run --user 12345`: /data is not its own.
            refused = in_image(
                stage, None, [*stage.entrypoint, "stats"], env, user=["--userspec=12345:12345"]
            )
            assert refused.returncode == 2
            assert refused.stderr.strip().count("\n") == 0 and "/data is not writable" in (
                refused.stderr
            ), refused.stderr
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=30)
    output = server.stdout.read().decode() if server.stdout else ""
    assert "created an admin key, shown once: mr_" in output, output[-3000:]
