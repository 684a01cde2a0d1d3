"""The README, followed literally: every command of its shell blocks runs as written.

The commands run in order, in one bash session, in a copy of the checkout with a fresh
HOME, the way a newcomer would type them: `bash .ci/setup` really runs (on a new
`.venv` whose packages come from this test's venv through a .pth file, so nothing is
downloaded but pip and the build backend), a line that starts `memrelay serve` runs in
the background until the server answers (and the previous one is stopped first, as the
newcomer would), and the curl examples talk to it. A command that cannot run here is in
NOT_RUN with the reason; the list is short, and every entry must still match a README
line. Also: the settings table says which settings are flags, true to `serve`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import typer

from proxy.cli.main import app
from proxy.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PORT = 8421  # the README's address

# Command prefix -> why it is not run here.
NOT_RUN = {
    "bash .ci/setup test && .venv/bin/python -m pytest": "the test suite itself, which holds "
    "this test: .ci/run runs exactly this line (checked below)",
    "docker ": "no Docker engine runs here: tests/test_docker_image.py builds the image's "
    "filesystem in a Debian chroot and starts it as `docker run` would",
    "export MEMRELAY_DB=postgresql://": "db.internal is an example host: the CLI and serve on a "
    "real Postgres are tested in tests/test_cli_postgres.py and tests/test_replicas.py",
    'memrelay migrate --db "$MEMRELAY_DB"': "the same example Postgres host",
    "memrelay serve  ": "the same example Postgres host (every replica)",
}


def shell_commands(text: str) -> list[str]:
    """The commands of every ```sh block: continuation lines joined, blank lines dropped."""
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        for command in re.sub(r"\\\n\s*", " ", block).splitlines():
            if command.strip():
                commands.append(command.strip())
    return commands


def reason_not_run(command: str) -> str | None:
    return next((why for prefix, why in NOT_RUN.items() if command.startswith(prefix)), None)


def test_not_run_list_is_short_and_current():
    commands = shell_commands(README)
    for prefix in NOT_RUN:
        assert any(c.startswith(prefix) for c in commands), f"stale NOT_RUN entry {prefix!r}"
    skipped = [c for c in commands if reason_not_run(c)]
    assert len(skipped) <= 8 and len(skipped) * 3 < len(commands), skipped
    ci_run = (ROOT / ".ci" / "run").read_text()
    assert "bash .ci/setup test && .venv/bin/python -m pytest" in ci_run


WAIT = """
import sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:
        urllib.request.urlopen(sys.argv[1], timeout=5)
        sys.exit(0)
    except Exception:
        time.sleep(0.5)
sys.exit(f"no answer from {sys.argv[1]}")
"""


def script(commands: list[str], python: str) -> str:
    """One bash script running `commands` in order; servers in the background."""
    lines = [
        "set -eo pipefail",
        "SERVER=",
        'stop() { if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null; wait "$SERVER"'
        " 2>/dev/null || true; SERVER=; fi; }",
        "trap stop EXIT",
        "trap 'echo \"::: failed: command $N\" >&2' ERR",
    ]
    for number, command in enumerate(commands):
        lines.append(f"N={number}; echo; echo '::: {number}: {command.replace(chr(39), '')}'")
        if reason_not_run(command):
            lines.append("echo '::: not run'")
            continue
        if "memrelay serve" in command:
            ready = "readyz" if "--upstream" not in command else "healthz"
            lines += [
                "stop",
                f"( {command} ) > serve-{number}.log 2>&1 &",
                "SERVER=$!",
                f"{python} -c {shlex.quote(WAIT)} "
                f"http://127.0.0.1:{PORT}/memrelay/{ready} 600 "
                f"|| {{ cat serve-{number}.log; exit 1; }}",
            ]
        else:
            lines.append(command)
    lines.append("stop")
    return "\n".join(lines) + "\n"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_every_readme_shell_command_runs_as_written(tmp_path):
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", PORT))
        except OSError:
            pytest.fail(f"port {PORT} (the README's) is taken by another process")
    if shutil.which("curl") is None:
        pytest.fail("curl is missing (the README's examples use it)")
    work = tmp_path / "checkout"
    work.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, work / name)
    for name in ("proxy", "memory_core", "extraction", ".ci", "docker"):
        shutil.copytree(ROOT / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    # A new venv that sees this test's packages: `.ci/setup` then installs memrelay (from
    # this copy) and finds every dependency present.
    subprocess.run([sys.executable, "-m", "venv", str(work / ".venv")], check=True, timeout=120)
    site = next((work / ".venv" / "lib").glob("python3*/site-packages"))
    shared = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz-readme-test-shared.pth").write_text("\n".join(sorted(shared)) + "\n")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMRELAY_", "PYTHON", "XDG_"))}
    env.update({"HOME": str(home), "COLUMNS": "200", "PATH": "/usr/local/bin:/usr/bin:/bin"})
    commands = shell_commands(README)
    (work / "readme.sh").write_text(script(commands, str(work / ".venv" / "bin" / "python")))
    process = subprocess.Popen(
        ["bash", "readme.sh"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=1400)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    (tmp_path / "readme.out").write_text(output)
    assert process.returncode == 0, output[-6000:]
    # What the README says the examples show.
    assert "x-memrelay-recall-status: ok" in output and "x-memrelay-recalled: 1" in output
    assert "forgotten:" in output and "exported 2 memories" in output
    assert "created an admin key" not in output  # that is the Docker image's entrypoint
    ran = [c for c in commands if not reason_not_run(c)]
    assert len(re.findall(r"^::: \d+:", output, re.MULTILINE)) == len(commands) and ran


def test_settings_table_says_which_settings_are_flags():
    section = README.split("## Settings", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(MEMRELAY_\w+)` \| ?(`--[\w-]+`)? ?\|", section, re.MULTILINE)
    assert len(rows) > 20
    group = typer.main.get_command(app)
    serve = {p.envvar: p for p in group.commands["serve"].params if p.envvar}  # type: ignore[attr-defined]
    for variable, flag in rows:
        field = "upstream_url" if variable == "MEMRELAY_UPSTREAM_URL" else variable[9:].lower()
        assert field in Settings.model_fields, variable
        if flag:
            assert variable in serve, f"{variable}: the README gives {flag}, serve has none"
            assert flag.strip("`") in serve[variable].opts, variable
        else:
            assert variable not in serve, f"{variable} is a serve flag; the README says env-only"
    assert set(serve) <= {variable for variable, _ in rows}, "a serve flag missing from README"
