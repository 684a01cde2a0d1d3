"""Run a Dockerfile's instructions in chroots of a Debian root: the image, without an engine.

Each `FROM` stage starts as a copy of the cached Debian root (tests/debian_root.py);
`ENV`, `WORKDIR`, `COPY` (from the build context, filtered by .dockerignore, or
`--from` an earlier stage), `RUN` (`/bin/sh -c` in a chroot with /proc and /dev
mounted), `USER`, `ENTRYPOINT`, `CMD` and `HEALTHCHECK` behave as `docker build` runs
them. `VOLUME` and `EXPOSE` only record. Liberties this environment needs, each named
where it is taken: the host's resolv.conf and CA bundle (this machine reaches the
package registries through a TLS-inspecting proxy whose CA Debian's bundle lacks).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
CHROOT_CA = "/etc/memrelay-test-host-ca.crt"
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, continuation lines joined."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            name, _, args = line.strip().partition(" ")
            out.append((name.upper(), args.strip()))
    return out


def pattern_regex(pattern: str) -> str:
    """A .dockerignore pattern as a regex: `**/` any folders, `*` and `?` within one name."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return out


def ignored(relative: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps `relative` (or a folder holding it) out of the context;
    the last matching pattern wins, `!` re-includes."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = pattern_regex(pattern.lstrip("!").strip("/"))
        if any(re.fullmatch(regex, prefix) for prefix in prefixes):
            result = not negate
    return result


@dataclass
class Stage:
    name: str
    root: Path
    env: dict[str, str] = field(default_factory=lambda: {"PATH": DEBIAN_PATH})
    workdir: str = "/"
    user: str = "root"
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)


@contextlib.contextmanager
def mounted(root: Path) -> Iterator[None]:
    """/proc and /dev inside the root for the duration of a command, unmounted after."""
    done: list[Path] = []
    try:
        for source, target, options in (
            ("proc", root / "proc", ["-t", "proc"]),
            ("/dev", root / "dev", ["--bind"]),
        ):
            target.mkdir(exist_ok=True)
            subprocess.run(["mount", *options, source, str(target)], check=True)
            done.append(target)
        yield
    finally:
        for target in reversed(done):
            subprocess.run(["umount", "-l", str(target)], check=False)


class ChrootBuild:
    """Builds the stages of `dockerfile` from `base` under `work`, logging to `log`."""

    def __init__(self, dockerfile: Path, context: Path, base: Path, work: Path, log: Path) -> None:
        self.dockerfile = dockerfile
        self.context = context
        self.base = base
        self.work = work
        self.log = log
        ignore = context / ".dockerignore"
        self.ignore = [
            line.strip()
            for line in (ignore.read_text().splitlines() if ignore.exists() else [])
            if line.strip() and not line.startswith("#")
        ]
        self.stages: dict[str, Stage] = {}

    def build(self) -> Stage:
        stage: Stage | None = None
        for name, args in instructions(self.dockerfile.read_text()):
            if name == "FROM":
                stage = self._from(args)
                continue
            assert stage is not None, f"{name} before FROM"
            handler = getattr(self, "_" + name.lower(), None)
            assert handler is not None, f"unsupported instruction {name}"
            handler(stage, args)
        assert stage is not None
        return stage

    def _from(self, args: str) -> Stage:
        words = args.split()
        name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(self.stages))
        root = self.work / f"stage-{len(self.stages)}"
        subprocess.run(["cp", "-a", str(self.base), str(root)], check=True)
        shutil.copyfile("/etc/resolv.conf", root / "etc" / "resolv.conf")  # liberty: network
        if HOST_CA.exists():  # liberty: this machine's TLS-inspecting proxy
            shutil.copyfile(HOST_CA, root / CHROOT_CA.lstrip("/"))
        stage = Stage(name, root)
        self.stages[name] = stage
        self.stages[str(len(self.stages) - 1)] = stage
        return stage

    def _env(self, stage: Stage, args: str) -> None:
        for pair in shlex.split(args):
            key, _, value = pair.partition("=")
            stage.env[key] = re.sub(
                r"\$\{?(\w+)\}?", lambda m: stage.env.get(m.group(1), ""), value
            )

    def _workdir(self, stage: Stage, args: str) -> None:
        stage.workdir = str(Path(stage.workdir, args))
        (stage.root / stage.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)

    def _copy(self, stage: Stage, args: str) -> None:
        words = shlex.split(args)
        source_root, source_stage = self.context, None
        if words[0].startswith("--from="):
            source_stage = self.stages[words.pop(0).split("=", 1)[1]]
            source_root = source_stage.root
        *sources, dest = words
        target = Path(stage.workdir, dest) if not dest.startswith("/") else Path(dest)
        into_dir = dest.endswith("/") or len(sources) > 1
        for source in sources:
            origin = source_root / source.lstrip("/")
            assert origin.exists(), f"COPY source {source} does not exist"
            final = stage.root / str(target).lstrip("/")
            if origin.is_dir():
                self._copy_tree(origin, final, source_stage is None)
            else:
                if into_dir:
                    final = final / origin.name
                final.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, final)

    def _copy_tree(self, origin: Path, final: Path, from_context: bool) -> None:
        for path in sorted(origin.rglob("*")):
            relative = path.relative_to(origin)
            if from_context and ignored(str(path.relative_to(self.context)), self.ignore):
                continue
            destination = final / relative
            if path.is_symlink():
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.unlink(missing_ok=True)
                destination.symlink_to(os.readlink(path))
            elif path.is_dir():
                destination.mkdir(parents=True, exist_ok=True)
            else:
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, destination)
        final.mkdir(parents=True, exist_ok=True)

    def _run(self, stage: Stage, args: str) -> None:
        command = json.loads(args) if args.startswith("[") else ["/bin/sh", "-c", args]
        env = dict(stage.env)
        if HOST_CA.exists():
            env.update({"PIP_CERT": CHROOT_CA, "SSL_CERT_FILE": CHROOT_CA})
        env.setdefault("HOME", "/root")
        env["DEBIAN_FRONTEND"] = "noninteractive"
        with self.log.open("ab") as out, mounted(stage.root):
            out.write(f"\n$ RUN {args}\n".encode())
            out.flush()
            subprocess.run(
                [
                    "chroot",
                    str(stage.root),
                    "/usr/bin/env",
                    "-i",
                    *(f"{k}={v}" for k, v in env.items()),
                    "/bin/sh",
                    "-c",
                    f'cd {shlex.quote(stage.workdir)} && exec "$@"',
                    "sh",
                    *command,
                ],
                check=True,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=900,
            )

    def _user(self, stage: Stage, args: str) -> None:
        stage.user = args

    def _entrypoint(self, stage: Stage, args: str) -> None:
        stage.entrypoint = json.loads(args)

    def _cmd(self, stage: Stage, args: str) -> None:
        stage.cmd = json.loads(args)

    def _healthcheck(self, stage: Stage, args: str) -> None:
        stage.healthcheck = json.loads(args.split("CMD", 1)[1])

    def _volume(self, stage: Stage, args: str) -> None:
        stage.volumes += json.loads(args)

    def _expose(self, stage: Stage, args: str) -> None:
        pass

    def _label(self, stage: Stage, args: str) -> None:
        pass
