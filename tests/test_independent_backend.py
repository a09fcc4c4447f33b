"""The second local backend (kinesis-mock and dynalite, issue 46): loopback only, stopped whole, and the
local-only steps for what dynalite lacks (no TTL; no index added to the KCL's lease table later).

Real servers and real processes throughout: the listening sockets are read from /proc/net/tcp and tcp6
and matched to the servers' processes through their file descriptors.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from copier.local.independent import ENV_MARK, LEASE_INDEX, Endpoints, create_lease_table
from tests.support.backend import DUMMY_ENV, ROOT, client, local_backend
from tests.support.props import write_properties

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def _listening(pids: set[int]) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state held by one of ``pids``."""
    inodes: set[str] = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    found: list[tuple[str, int]] = []
    for table, width in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != _LISTEN or inode not in inodes:
                continue
            hex_address, hex_port = local.split(":")
            raw = bytes.fromhex(hex_address)
            # /proc prints each 32-bit word in host (little-endian) order
            ordered = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
            found.append((str(ipaddress.ip_address(ordered)), int(hex_port, 16)))
    return found


def _children(pid: int) -> set[int]:
    """Every process whose parent is ``pid`` (one level: the servers a launcher started)."""
    out: set[int] = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie has exited: it only waits for its new parent, init, to reap it)."""
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return (mapped or ip).is_loopback


def test_nothing_the_tests_start_listens_beyond_loopback(independent: Endpoints) -> None:
    """Every listener of both backends (kinesis-mock's plain and TLS ports, dynalite's, moto's) is on
    127.0.0.1: kinesis-mock itself would bind every interface."""
    sockets = _listening(set(independent.pids))
    assert len(sockets) == 3, sockets  # kinesis-mock: plain + TLS; dynalite: one
    with local_backend():
        moto_pids = {p for p in _children(os.getpid()) if b"local-backend" in Path(f"/proc/{p}/cmdline").read_bytes()}
        moto = _listening(moto_pids)
    assert moto, "the moto backend's listener was not found"
    assert [s for s in sockets + moto if not _loopback(s[0])] == []


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_the_command_starts_both_and_leaves_no_node_process_when_stopped(stop_signal: signal.Signals) -> None:
    """``copier local-backend --impl independent`` serves both; stopped (SIGTERM: it stops their process
    groups) or killed (SIGKILL: their stdin pipes close and the preload makes them exit), no node is left."""
    proc = subprocess.Popen(
        [str(ROOT / ".venv/bin/copier"), "local-backend", "--impl", "independent", "--streams", "s1:2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **DUMMY_ENV},
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().split()
        assert ready[0] == "READY" and ready[1].startswith("kinesis=http://127.0.0.1:"), ready
        servers = _children(proc.pid)
        assert len(servers) == 2
        assert all(_loopback(a) for a, _ in _listening(servers))
        kinesis = client("kinesis", ready[1].removeprefix("kinesis="))
        assert kinesis.describe_stream_summary(StreamName="s1")["StreamDescriptionSummary"]["OpenShardCount"] == 2
        proc.send_signal(stop_signal)
        assert proc.wait(timeout=30) == (0 if stop_signal == signal.SIGTERM else -signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in servers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in servers if _alive(pid)}
    assert not left


def _init(properties: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != ENV_MARK}
    return subprocess.run(
        [str(ROOT / ".venv/bin/copier"), "init", "--properties", str(properties)],
        capture_output=True,
        text=True,
        env={**base, **DUMMY_ENV, **env},
        timeout=120,
    )


def test_init_on_dynalite_says_there_is_no_ttl_only_when_told_it_is_the_local_backend(
    independent: Endpoints, tmp_path: Path
) -> None:
    """dynalite has no UpdateTimeToLive: ``copier init`` refuses (exit 3, naming the call) unless the process
    is told it runs on the independent local backend, then says the batches never expire there."""
    props = write_properties(
        tmp_path / "a.properties", independent.kinesis, "s", "t", "state-ttl-a", dynamodb_endpoint=independent.dynamodb
    )
    refused = _init(props)
    assert refused.returncode == 3 and "UpdateTimeToLive" in refused.stderr + refused.stdout
    told = _init(props, **{ENV_MARK: "independent"})
    assert told.returncode == 0, told.stderr
    assert "no UpdateTimeToLive" in told.stdout and "never expire" in told.stdout


def test_the_mark_is_believed_only_on_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local-only step is never taken for an endpoint that is not a loopback address (as on AWS)."""
    from copier.adapters.statettl import local_without_ttl
    from copier.core.config import load_config

    monkeypatch.setenv(ENV_MARK, "independent")
    here = write_properties(tmp_path / "here.properties", "http://127.0.0.1:4566", "s", "t", "state")
    assert local_without_ttl(load_config(here))
    there = write_properties(tmp_path / "there.properties", "https://10.1.2.3:4566", "s", "t", "state")
    assert not local_without_ttl(load_config(there))


def test_the_lease_table_is_made_with_the_index_the_kcl_looks_for(independent: Endpoints) -> None:
    assert create_lease_table(independent.dynamodb, "lease-index-test")
    assert not create_lease_table(independent.dynamodb, "lease-index-test")  # already there: left as it is
    table = client("dynamodb", independent.dynamodb).describe_table(TableName="lease-index-test")["Table"]
    (index,) = table["GlobalSecondaryIndexes"]
    assert index["IndexName"] == LEASE_INDEX and index["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    assert [k["AttributeName"] for k in index["KeySchema"]] == ["leaseOwner", "leaseKey"]


def test_the_emulator_refuses_only_what_an_aws_account_would(independent: Endpoints) -> None:
    """kinesis-mock's own defaults (50 shards, closed ones counted; 10 on-demand streams) stopped a chaos run at
    its twelfth seed; the backend is started with AWS's large-region account defaults instead."""
    kinesis = client("kinesis", independent.kinesis)
    provisioned, on_demand = "limit-test-provisioned", [f"limit-test-on-demand-{n}" for n in range(11)]
    try:
        kinesis.create_stream(StreamName=provisioned, ShardCount=120)  # over kinesis-mock's 50 in one stream
        for name in on_demand:  # over kinesis-mock's 10 on-demand streams
            kinesis.create_stream(StreamName=name, StreamModeDetails={"StreamMode": "ON_DEMAND"})
        summary = kinesis.describe_stream_summary(StreamName=provisioned)["StreamDescriptionSummary"]
        assert summary["OpenShardCount"] == 120
    finally:
        for name in [provisioned, *on_demand]:
            try:
                kinesis.delete_stream(StreamName=name, EnforceConsumerDeletion=True)
            except kinesis.exceptions.ResourceNotFoundException:
                pass
