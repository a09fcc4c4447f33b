"""The command line: clear one-line errors with status 2 before any AWS call, and init."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Pipeline
from tests.support.backend import DUMMY_ENV, ROOT, free_port

COPIER = str(ROOT / ".venv" / "bin" / "copier")


def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COPIER, *args], capture_output=True, text=True, input=stdin, env={**os.environ, **DUMMY_ENV}, timeout=60
    )


def bad_file(tmp_path: Path, port: int | None = None) -> Path:
    """A file with a malformed value, whose endpoints point at ``port`` (default: one nobody listens on)."""
    port = port or free_port()
    path = tmp_path / "bad.properties"
    path.write_text(
        "applicationName = app\nstreamName = s\nregionName = us-east-1\n"
        f"kinesisEndpoint = http://127.0.0.1:{port}\ndynamoDBEndpoint = http://127.0.0.1:{port}\n"
        "copier.targetStreamName = t\ncopier.dedupKey = json:id\ncopier.putTimeoutMillis = fast\n"
    )
    return path


@pytest.mark.parametrize("command", ["process", "init"])
def test_a_malformed_file_stops_the_command_with_one_line_and_status_2(tmp_path: Path, command: str) -> None:
    """The file, the key and the problem on one stderr line; nothing on stdout (the protocol channel); and no
    AWS call attempted: the endpoints' port is a listener that counts connections (before, a time bound stood
    for this, which a slow enough machine could break)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        path = bad_file(tmp_path, listener.getsockname()[1])
        result = run(command, "--properties", str(path), stdin='{"action": "initialize", "shardId": "s-1"}\n')
        with pytest.raises(BlockingIOError):
            listener.accept()  # a connection was made: an AWS call was attempted
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"copier: {path}:8: copier.putTimeoutMillis: expected a whole number, got 'fast'\n"


def test_check_config_accepts_a_good_file_and_rejects_a_bad_one(tmp_path: Path) -> None:
    """check-config prints a summary for a good file and the problem for a bad one."""
    good = run("check-config", "--offline", str(ROOT / "properties" / "copier.properties"))
    assert good.returncode == 0 and "ok: events-staging -> events" in good.stdout
    bad = run("check-config", str(bad_file(tmp_path)))
    assert bad.returncode == 2 and "copier.putTimeoutMillis" in bad.stderr


def test_check_config_warns_of_settings_production_should_not_run_with(tmp_path: Path) -> None:
    """The sample file draws no warning; the KCL defaults for graceful handoff and shutdown grace each draw one."""
    sample = (ROOT / "properties" / "copier.properties").read_text()
    assert run("check-config", "--offline", str(ROOT / "properties" / "copier.properties")).stderr == ""
    defaults = tmp_path / "defaults.properties"
    defaults.write_text(
        sample.replace("isGracefulLeaseHandoffEnabled = false", "").replace("shutdownGraceMillis = 20000", "")
    )
    result = run("check-config", "--offline", str(defaults))
    assert result.returncode == 0
    warnings = result.stderr.splitlines()
    assert len(warnings) == 2 and all(w.startswith(f"copier: warning: {defaults}: ") for w in warnings)
    assert "shutdownGraceMillis is 0" in warnings[0]
    assert "isGracefulLeaseHandoffEnabled is true" in warnings[1]
    assert "set isGracefulLeaseHandoffEnabled = false" in warnings[1]


def test_init_is_idempotent(pipeline: Pipeline) -> None:
    """init creates the table once and then reports that it exists, with its TTL on expires_at."""
    again = pipeline.init()
    assert again.stdout.strip() == f"state table {pipeline.table}: already exists; TTL on expires_at: enabled"


@pytest.mark.protocol
def test_a_missing_state_table_ends_the_processor_with_a_logged_reason(pipeline: Pipeline, tmp_path: Path) -> None:
    """An unrecoverable fault exits (status 3) instead of acknowledging a batch it did not forward."""
    pipeline.table = "never-created"
    pipeline.write_properties()
    initialize = {"action": "initialize", "shardId": "s-0", "sequenceNumber": "TRIM_HORIZON", "subSequenceNumber": 0}
    result = run("process", "--properties", str(pipeline.properties), stdin=json.dumps(initialize) + "\n")
    assert result.returncode == 3
    assert result.stdout.strip() == "", "no status: the action was not acknowledged"
    assert "ResourceNotFoundException" in result.stderr


def test_a_file_that_cannot_be_read_is_named_with_the_reason_alone(tmp_path: Path) -> None:
    """No stray key field (it once printed ``FILE: -: cannot read the file``)."""
    missing = tmp_path / "missing.properties"
    result = subprocess.run(
        [str(ROOT / ".venv/bin/copier"), "check-config", str(missing)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr == f"copier: {missing}: cannot read the file: No such file or directory\n"
