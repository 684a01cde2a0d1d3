"""A Debian root folder standing in for the Docker image's base, built with debootstrap.

No Docker engine runs here, so tests build the image's filesystem themselves: debootstrap
makes a minimal Debian root from Debian's packages, and `tests/dockerfile_chroot.py` runs
the Dockerfile's instructions inside it with chroot. The base root is cached between runs
(keyed by the suite and the packages that stand in for the Python image), because
debootstrap takes minutes from cold.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

SUITE = "trixie"
# python:3.13-slim-trixie is Debian trixie plus a CPython 3.13 build in /usr/local that
# links Debian's own libraries (libsqlite3, libssl, ...). Debian trixie's python3 is
# CPython 3.13 built against the same libraries, with the same loadable-extension
# support in sqlite3; python-is-python3 gives the `python` command the image has.
# Nothing else is added: libgomp1 and the rest must come from the Dockerfile's own steps.
STANDIN_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")


def cache_root() -> Path:
    base = os.environ.get("MEMRELAY_TEST_CACHE") or Path.home() / ".cache" / "memrelay-tests"
    return Path(base)


def ensure_debootstrap() -> str:
    """The debootstrap command, installed from Debian's packages when missing."""
    found = shutil.which("debootstrap") or (
        "/usr/sbin/debootstrap" if Path("/usr/sbin/debootstrap").exists() else None
    )
    if found:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=300)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "debootstrap"], check=True, env=env, timeout=300
    )
    return "/usr/sbin/debootstrap"


def base_root(log: Path) -> Path:
    """The cached minimal Debian root (built atomically: a half-built root is never used)."""
    key = hashlib.sha256(f"{SUITE}|{','.join(STANDIN_PACKAGES)}".encode()).hexdigest()[:12]
    root = cache_root() / f"debroot-{SUITE}-{key}"
    if (root / ".complete").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    building = root.with_name(root.name + f".building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    with log.open("ab") as out:
        subprocess.run(
            [
                ensure_debootstrap(),
                "--variant=minbase",
                f"--include={','.join(STANDIN_PACKAGES)}",
                SUITE,
                str(building),
            ],
            check=True,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=900,
        )
    (building / ".complete").write_text("ok\n")
    if root.exists():  # a concurrent run finished first
        shutil.rmtree(building, ignore_errors=True)
    else:
        building.rename(root)
    return root
