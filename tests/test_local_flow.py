"""The local flow as README and properties/local.properties give it, with no AWS variable in the environment.

Issue 45: README promised that copier signs with dummy keys on the local
backend, but only init and run did: produce failed after 37 s and a thousand
lines of Spark tracebacks (NoCredentialsError), verify with ``ListShards
failed: NoCredentialsError``. Every test here runs copier's commands as a
person who has never configured AWS would: no ``AWS_*`` variable at all, a
home directory without ``~/.aws``, and a PATH without the virtualenv (the
commands are run as ``.venv/bin/copier``, as README shows them). The backend
is started the way the quick start starts it (``copier local-backend
--streams``), and the properties file is a copy of
``properties/local.properties``, edited only for the port (and the extra
keys a test needs): a copy must work as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from copier.local.streams import parse_streams
from tests.support.backend import ROOT, client, free_port, read_stream

COPIER = str(ROOT / ".venv" / "bin" / "copier")
LOCAL = ROOT / "properties" / "local.properties"
EVENTS = 40


def bare_env(home: Path) -> dict[str, str]:
    """This environment without any AWS variable, a fresh home (no ~/.aws) and no virtualenv on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    home.mkdir(exist_ok=True)
    env["HOME"] = str(home)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", os.defpath).split(os.pathsep) if ".venv" not in p)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"  # as README runs copier produce
    return env


def _line(stream: object, timeout_s: float) -> str:
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
        assert selector.select(timeout_s), f"no line within {timeout_s} s"
        return str(stream.readline())  # type: ignore[attr-defined]


@dataclass
class Local:
    """A backend started as the quick start starts it, and a copy of properties/local.properties for it."""

    endpoint: str
    properties: Path
    env: dict[str, str]
    tmp: Path

    def copier(self, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
        """A copier command in the bare environment; it must succeed and never mention credentials."""
        result = subprocess.run(
            [COPIER, *args], capture_output=True, text=True, env=self.env, timeout=timeout_s, cwd=self.tmp
        )
        said = result.stdout + result.stderr
        assert "NoCredentials" not in said and "Unable to locate credentials" not in said, (args, said[-3000:])
        assert result.returncode == 0, (args, said[-3000:])
        return result


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    env = bare_env(tmp_path / "home")
    port = free_port()
    streams = "staging:2,target:1,deadletter:1"
    backend = subprocess.Popen(
        [COPIER, "local-backend", "--port", str(port), "--streams", streams],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _line(backend.stdout, 60) == f"READY http://127.0.0.1:{port}\n"
        properties = tmp_path / "copier.properties"
        text = LOCAL.read_text().replace("127.0.0.1:4566", f"127.0.0.1:{port}")
        # a dead-letter stream for copier redrive; no class-data archive in a home that lives one test
        properties.write_text(text + "copier.deadLetterStreamName = deadletter\ncopier.jvmClassArchive = none\n")
        yield Local(f"http://127.0.0.1:{port}", properties, env, tmp_path)
    finally:
        backend.send_signal(signal.SIGTERM)
        try:
            _, stderr = backend.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            backend.kill()
            _, stderr = backend.communicate()
    assert "created staging (2 shards), target (1 shard), deadletter (1 shard)" in stderr
    assert "memory" in stderr, "the backend says that it keeps everything in memory"


def _events(directory: Path) -> list[str]:
    directory.mkdir()
    ids = [f"evt-flow-{n:04d}" for n in range(EVENTS)]
    lines = [json.dumps({"eventId": i, "amount": n}) for n, i in enumerate(ids)]
    (directory / "part-0.json").write_text("\n".join(lines) + "\n")
    return ids


def _wait_for_target(local: Local, count: int, worker: subprocess.Popen[bytes], timeout_s: float) -> None:
    kinesis = client("kinesis", local.endpoint)
    deadline = time.monotonic() + timeout_s
    while len(read_stream(kinesis, "target")) < count:
        assert worker.poll() is None, f"copier run exited {worker.returncode}"
        assert time.monotonic() < deadline, f"the target did not get {count} records in {timeout_s} s"
        time.sleep(1)


@pytest.mark.protocol
@pytest.mark.timeout(900)
def test_every_local_command_runs_with_no_aws_variables(local: Local) -> None:
    """init, check-config, produce (Spark), run (the daemon and its processors), status, verify, export,
    audit (Spark), redrive and repair, each against the local backend with no AWS variable set."""
    props = str(local.properties)
    assert "created" in local.copier("init", "--properties", props).stdout
    local.copier("check-config", props)  # a copy of the sample, executableName as it is
    ids = _events(local.tmp / "input")
    manifest = local.tmp / "manifest.txt"
    manifest.write_text("\n".join(ids) + "\n")
    local.copier(
        "produce", "--properties", props, "--input", str(local.tmp / "input"), "--checkpoint",
        str(local.tmp / "checkpoint"), "--once", "--id-column", "eventId",
    )  # fmt: skip

    log = (local.tmp / "worker.log").open("wb")
    worker = subprocess.Popen(
        [COPIER, "run", "--properties", props], env=local.env, stdout=log, stderr=subprocess.STDOUT, cwd=local.tmp
    )
    try:
        _wait_for_target(local, EVENTS, worker, 300)
        status = local.copier("status", "--properties", props).stdout
        assert f"forwarded {EVENTS}," in status, status
        verified = json.loads(
            local.copier("verify", "--properties", props, "--manifest", str(manifest), "--json").stdout
        )
        assert (verified["ok"], verified["complete"], verified["target_records"]) == (True, True, EVENTS)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()
    worker_log = (local.tmp / "worker.log").read_text()
    assert worker.returncode == 0, worker_log[-3000:]
    assert "NoCredentials" not in worker_log and "Unable to load credentials" not in worker_log

    exported = local.tmp / "export"
    local.copier("export", "--properties", props, "--stream", "target", "--out", str(exported))
    audit = local.copier("audit", "--properties", props, "--manifest", str(manifest), "--target", str(exported))
    assert "audit: OK" in audit.stdout, audit.stdout
    local.copier("redrive", "--properties", props, "--dry-run")
    now_ms = int(time.time() * 1000)
    local.copier("repair", "--properties", props, "--since", "-1h", "--until", str(now_ms + 60_000), "--dry-run")


@pytest.mark.protocol
@pytest.mark.timeout(900)
def test_the_demo_runs_with_no_aws_variables_and_leaves_nothing_in_tmp(tmp_path: Path) -> None:
    """copier demo, end to end with a worker killed, in the bare environment: its summary says lost 0,
    duplicated 0 and OK (read from verify's report), and its temporary files, Spark's among them (a SIGKILLed
    Spark job never removes its own), are gone when it ends."""
    env = bare_env(tmp_path / "home")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env["TMPDIR"] = str(scratch)
    result = subprocess.run(
        [COPIER, "demo", "--events", "1000", "--timeout", "240"], capture_output=True, text=True, env=env, timeout=840
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    rows = {" ".join(r.split()[:-1]): r.split()[-1] for r in result.stdout.split("\nsummary\n")[1].splitlines() if r}
    assert (rows["lost"], rows["duplicated"], rows["verify"], rows["target records"]) == ("0", "0", "OK", "1000")
    assert "NoCredentials" not in result.stdout + result.stderr
    assert sorted(p.name for p in scratch.iterdir()) == []


def test_streams_are_given_as_name_and_shards() -> None:
    """``--streams staging:4,target``: one shard when the count is left out; argparse's error for the rest."""
    assert parse_streams("staging:4, target") == [("staging", 4), ("target", 1)]
    for bad, said in [("a:0", "1 to 50"), ("a:x", "whole number"), ("a,a", "given twice"), ("no way", "stream name")]:
        with pytest.raises(argparse.ArgumentTypeError, match=said):
            parse_streams(bad)
