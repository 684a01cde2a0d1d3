"""`memrelay serve` on a busy port fails before it starts anything: no llama.cpp, no
store opened, no job queue touched (so it cannot disturb the server already there)."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from proxy.cli.main import app
from proxy.preflight import PortBusy, check_port_free


@pytest.fixture
def busy_port():
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def test_a_busy_port_is_refused_before_anything_starts(busy_port, tmp_path):
    db = tmp_path / "never.db"
    result = CliRunner().invoke(
        app,
        ["serve", "--port", str(busy_port), "--db", str(db)],  # no upstream: llama.cpp
        env={"COLUMNS": "300"},
    )
    assert result.exit_code == 2
    assert f"cannot listen on 127.0.0.1:{busy_port}" in " ".join(result.output.split())
    assert not db.exists()  # the store (and its queue) was never opened


def test_a_free_port_passes(busy_port):
    with pytest.raises(PortBusy):
        check_port_free("127.0.0.1", busy_port)
    check_port_free("127.0.0.1", 0)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    check_port_free("127.0.0.1", free)
