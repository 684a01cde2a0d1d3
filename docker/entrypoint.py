#!/opt/memrelay/bin/python
"""The image's entrypoint: make /data usable, give a first start a key, run memrelay.

- Started as root (the default), it gives /data and memrelay's files in it to uid
  10001 (a host folder mounted on /data usually belongs to someone else), then drops
  to uid 10001. Started with `--user UID`, it only checks that /data is writable.
- `serve` with MEMRELAY_KEYS_FILE pointing at a file that does not exist yet (a first
  start): with MEMRELAY_INSECURE (compose's default) it serves open, without a keys
  file; without it, it creates an admin key in that file and
  prints it once, so a plain `docker run` starts, bound to 0.0.0.0 and closed to anyone
  without the key. Create your own keys first (`docker run ... memrelay keys create`)
  and this never happens.
- Arguments are memrelay's: `docker run IMAGE keys list`, `docker run IMAGE stats`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

UID = GID = 10001
OWN_FILES = ("memrelay.db", "memrelay.db-wal", "memrelay.db-shm", "keys.json")


def fail(message: str) -> None:
    print(f"memrelay-entrypoint: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def settle_data(data: Path) -> None:
    """As root: hand /data to uid 10001 and drop to it. Otherwise: check /data."""
    if os.getuid() != 0:
        if not os.access(data, os.W_OK | os.X_OK):
            fail(
                f"{data} is not writable by uid {os.getuid()}: chown the mounted folder to "
                f"{os.getuid()}, or start the container without --user"
            )
        return
    try:
        data.mkdir(parents=True, exist_ok=True)
        for path in [data, *(data / name for name in OWN_FILES)]:
            if path.exists() and not path.is_symlink() and path.stat().st_uid != UID:
                os.chown(path, UID, GID)
    except OSError as exc:
        fail(f"cannot give {data} to uid {UID} ({exc}): chown it on the host, or use --user")
    os.setgroups([])
    os.setgid(GID)
    os.setuid(UID)
    os.environ["HOME"] = str(data)


def first_key(args: list[str]) -> None:
    """On a first `serve` with keys expected but none yet: an admin key, shown once."""
    insecure = os.environ.get("MEMRELAY_INSECURE", "").strip().lower() in ("1", "true", "yes")
    keys_file = os.environ.get("MEMRELAY_KEYS_FILE", "").strip()
    if args[:1] != ["serve"] or not keys_file:
        return
    if any(a == "--keys-file" or a.startswith("--keys-file=") for a in args):
        return
    if Path(keys_file).exists():
        return
    if insecure or "--insecure" in args:
        # Open mode was asked for and no keys exist yet: serve without a keys file
        # (memrelay refuses a keys file that does not exist).
        os.environ.pop("MEMRELAY_KEYS_FILE", None)
        return
    made = subprocess.run(
        [
            "memrelay",
            "keys",
            "create",
            "--keys-file",
            keys_file,
            "--admin",
            "--json",
            "--name",
            "first admin key (created by the image)",
        ],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        fail(f"no keys file at {keys_file}, and creating one failed: {made.stderr.strip()}")
    key = json.loads(made.stdout)["key"]
    print(
        f"memrelay-entrypoint: no keys file at {keys_file} (MEMRELAY_KEYS_FILE): created an "
        f"admin key, shown once: {key}",
        file=sys.stderr,
        flush=True,
    )


def main() -> None:
    args = sys.argv[1:] or ["serve"]
    settle_data(Path(os.environ.get("MEMRELAY_DATA_DIR", "/data")))
    first_key(args)
    os.execvp("memrelay", ["memrelay", *args])


if __name__ == "__main__":
    main()
