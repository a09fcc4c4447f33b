"""The second local backend: kinesis-mock (Kinesis) and dynalite (DynamoDB), two Node servers on 127.0.0.1.

Why a second backend at all: moto needs runtime patches (:mod:`copier.local.moto_patches`) before copier and
the KCL run on it, and a claim proven only where the project patched the world is weaker than it looks.
kinesis-mock (npm ``kinesis-local``) and dynalite are independent open-source implementations of the two
APIs; the tests run the backend conformance suite, the state contract and an end-to-end daemon test on them
too. They are pinned in ``node/package.json`` and ``node/package-lock.json`` and installed by ``make
install`` (``npm ci --prefix node``); nothing else of copier needs Node.

How each is started, and why:

* Every listener binds 127.0.0.1 only. kinesis-mock binds every interface and has no option to choose one,
  so it runs under ``node --require loopback-preload.cjs``: the preload rewrites each ``net.Server.listen``
  to 127.0.0.1. dynalite is given ``--host 127.0.0.1`` and the same preload.
* Ports: both ask for a port the preload turns into an ephemeral one (port 1 is rewritten to 0: dynalite's
  CLI turns ``--port 0`` into 4567, and kinesis-mock's TLS port is one nobody uses) and report the port
  they got on a pipe, so no free-port probe races another process for it.
* Each server is the leader of a process group of its own and is stopped by signalling the group, and
  the preload exits when its stdin pipe closes, so even a killed parent leaves no Node process behind.
* kinesis-mock logs to stdout and loads ``./data/kinesis-data.json`` when it exists: both are sent into a
  temporary directory of their own (its cwd), with persistence off.
* The reshard, create and delete delays (500 ms by default in both) are set to 0: a stream is ACTIVE on
  the first describe after a call, as a test wants.

What dynalite lacks that copier or the KCL meet, handled here (the local backend's setup), never on a
code path AWS takes:

* No ``UpdateTimeToLive``: the state table's TTL cannot be enabled, so ``copier init``, ``check-config``
  and ``run`` would refuse it. A process given ``COPIER_LOCAL_BACKEND=independent`` (:data:`ENV_MARK`)
  with its state endpoint on a loopback address is told so, and goes on
  (:func:`copier.adapters.statettl.local_without_ttl`): the digest batches then never expire, as nothing
  does in a backend that lives in memory for one run.
* No GSI added by UpdateTable: KCL 3.x adds ``LeaseOwnerToLeaseKeyIndex`` to its lease table that way and
  shuts down after 20 refusals. :func:`create_lease_table` creates the lease table with the index in
  CreateTable itself (as the KCL would have made it: ``leaseKey`` hash key, on demand, the index
  ``leaseOwner`` + ``leaseKey``, KEYS_ONLY); run it before ``copier run``, once per ``applicationName``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from copier.adapters.statettl import LOCAL_BACKEND_ENV

__all__ = [
    "ENV_MARK",
    "LEASE_INDEX",
    "NODE_DIR",
    "Endpoints",
    "create_lease_table",
    "installed",
    "running",
    "serve",
    "servers",
]

#: The npm project holding both servers (``node/`` at the repository's root).
NODE_DIR = Path(os.environ.get("COPIER_NODE_DIR", Path(__file__).resolve().parents[2] / "node"))
PRELOAD = Path(__file__).with_name("loopback-preload.cjs")
#: Set (to ``independent``) in the environment of a copier process whose endpoints are this backend.
ENV_MARK = LOCAL_BACKEND_ENV
LEASE_INDEX = "LeaseOwnerToLeaseKeyIndex"  # the KCL 3.x index on its lease table

HOST = "127.0.0.1"
DEFAULT_PORT_OF_MOTO = 4566  # copier.local.backend.DEFAULT_PORT (not imported: that module imports this one)
#: kinesis-mock's own account limits are far below AWS's (50 shards, closed ones counted, and 10 on-demand
#: streams for the whole emulator): a chaos run's twelfth seed met them. These are AWS's defaults in its large
#: regions (us-east-1, us-west-2, eu-west-1: 20,000 shards; 50 on-demand streams), so the emulator refuses
#: only what an account would.
ACCOUNT_LIMITS = {"SHARD_LIMIT": "20000", "ON_DEMAND_STREAM_COUNT_LIMIT": "50"}
START_TIMEOUT_S = 60.0  # kinesis-mock takes about 1 s of CPU to start; a loaded 2-core machine stretches it
STOP_TIMEOUT_S = 10.0
_PLACEHOLDER_PORT = "1"  # rewritten to 0 (ephemeral) by the preload
_ZERO_DELAYS = (
    "CREATE_STREAM_DURATION",
    "DELETE_STREAM_DURATION",
    "REGISTER_STREAM_CONSUMER_DURATION",
    "MERGE_SHARDS_DURATION",
    "SPLIT_SHARD_DURATION",
    "UPDATE_SHARD_COUNT_DURATION",
    "UPDATE_STREAM_MODE_DURATION",
)


@dataclass(frozen=True)
class Endpoints:
    """Where each service of a running backend answers (moto serves both on one URL)."""

    kinesis: str
    dynamodb: str
    pids: tuple[int, ...] = ()  # the server processes (each the leader of its own process group)
    impl: str = "independent"  # copier local-backend --impl: moto or independent


def _kinesis_mock() -> Path:
    return NODE_DIR / "node_modules" / "kinesis-local" / "main.js"


def _dynalite() -> Path:
    return NODE_DIR / "node_modules" / "dynalite" / "cli.js"


def installed() -> str | None:
    """None when both servers are installed; else what is missing and how to install it."""
    missing = [str(path) for path in (_kinesis_mock(), _dynalite()) if not path.is_file()]
    if not missing:
        return None
    return f"{', '.join(missing)} not found: run `make install` (npm ci --prefix {NODE_DIR})"


class _Server:
    """One Node server under the loopback preload, in a process group of its own, reporting its port."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], workdir: Path) -> None:
        self.name = name
        read_end, write_end = os.pipe()
        self._report = read_end
        full_env = {
            **os.environ,
            **env,
            "LOOPBACK_REPORT_FD": str(write_end),
            "LOOPBACK_PORT_REWRITE": f"{_PLACEHOLDER_PORT}:0",
            "LOOPBACK_EXIT_WITH_STDIN": "1",
        }
        try:
            with open(workdir / f"{name}.log", "ab") as log:
                self.proc = subprocess.Popen(
                    ["node", "--require", str(PRELOAD), *argv],
                    env=full_env,
                    cwd=workdir,
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(write_end,),
                    start_new_session=True,
                )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)

    def port(self, requested: str, deadline: float) -> int:
        """The port of the listener that asked for ``requested`` (as the preload reports it)."""
        buffer = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self._report], [], [], 0.1)
            if ready:
                chunk = os.read(self._report, 4096)
                buffer += chunk
                for line in buffer.decode(errors="replace").splitlines():
                    words = line.split()  # listening HOST:PORT requested R
                    if len(words) == 4 and words[3] == requested:
                        return int(words[1].rsplit(":", 1)[1])
                if not chunk:
                    break
            if self.proc.poll() is not None:
                break
        raise RuntimeError(f"{self.name} reported no port (exit status {self.proc.poll()}); see its log")

    def stop(self) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after STOP_TIMEOUT_S."""
        with contextlib.suppress(OSError):
            os.close(self._report)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # anything the server itself started
            os.killpg(self.proc.pid, signal.SIGKILL)


def _answers(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=1)
    try:
        connection.request("GET", "/", headers={"Connection": "close"})
        connection.getresponse().read()
        return True
    except OSError:
        return False
    finally:
        connection.close()


@contextlib.contextmanager
def servers() -> Iterator[Endpoints]:
    """kinesis-mock and dynalite on 127.0.0.1 (ephemeral ports) until the block ends; both always stopped."""
    problem = installed()
    if problem is not None:
        raise RuntimeError(problem)
    with tempfile.TemporaryDirectory(prefix="copier-independent-") as work:
        workdir = Path(work)
        started: list[_Server] = []
        try:
            kinesis_env = {
                "KINESIS_MOCK_PLAIN_PORT": "0",
                "KINESIS_MOCK_TLS_PORT": _PLACEHOLDER_PORT,
                "KINESIS_MOCK_CERT_PATH": str(_kinesis_mock().with_name("server.json")),
                "LOAD_DATA_IF_EXISTS": "false",
                "SHOULD_PERSIST_DATA": "false",
                "LOG_LEVEL": os.environ.get("KINESIS_MOCK_LOG_LEVEL", "ERROR"),
                **ACCOUNT_LIMITS,
                **{name: "0ms" for name in _ZERO_DELAYS},
            }
            started.append(_Server("kinesis-mock", [str(_kinesis_mock())], kinesis_env, workdir))
            delays = ["--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"]
            dynalite_argv = [str(_dynalite()), "--host", HOST, "--port", _PLACEHOLDER_PORT, *delays]
            started.append(_Server("dynalite", dynalite_argv, {}, workdir))
            deadline = time.monotonic() + START_TIMEOUT_S
            kinesis = f"http://{HOST}:{started[0].port('0', deadline)}"  # the plain port; TLS asked for 1
            dynamodb = f"http://{HOST}:{started[1].port(_PLACEHOLDER_PORT, deadline)}"
            while not (_answers(kinesis) and _answers(dynamodb)):
                if time.monotonic() > deadline or any(s.proc.poll() is not None for s in started):
                    raise RuntimeError(f"the independent backend did not answer; logs in {workdir}")
                time.sleep(0.05)
            yield Endpoints(kinesis, dynamodb, tuple(s.proc.pid for s in started))
        finally:
            for server in started:
                server.stop()


@contextlib.contextmanager
def running(impl: str, lease_tables: tuple[str, ...] = (), own_process: bool = False) -> Iterator[Endpoints]:
    """The local backend ``impl`` (``copier local-backend --impl``: moto or independent) until the block ends,
    with the KCL lease tables ``lease_tables`` made first on the independent one (:func:`create_lease_table`).
    The caller gives its copier processes ``COPIER_LOCAL_BACKEND=independent`` (:data:`ENV_MARK`) there.

    ``own_process``: moto in a process of its own (``copier local-backend``), not in a thread of the caller's,
    for a caller whose own threads are busy (the chaos suite's proxy and producer): in one process they share
    one interpreter lock with moto, and moto's answer to a put waits on them (kinesis-mock and dynalite always
    run in processes of their own)."""
    if impl == "independent":
        with servers() as endpoints:
            for table in lease_tables:
                create_lease_table(endpoints.dynamodb, table)
            yield endpoints
        return
    from copier.local.backend import LocalBackend, spawned  # it imports this module

    if own_process:
        with spawned() as endpoint:
            yield Endpoints(endpoint, endpoint, impl="moto")
        return
    with LocalBackend() as backend:
        yield Endpoints(backend.endpoint, backend.endpoint, impl="moto")


def create_lease_table(dynamodb_endpoint: str, table: str, region: str = "us-east-1") -> bool:
    """The KCL's lease table ``table`` (its ``applicationName``) created with ``LeaseOwnerToLeaseKeyIndex``
    in CreateTable itself, for dynalite, which cannot add it later; False if it already existed."""
    import boto3

    from copier.adapters.localkeys import DUMMY_ENV

    session = boto3.session.Session(
        aws_access_key_id=DUMMY_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=DUMMY_ENV["AWS_SECRET_ACCESS_KEY"],
        region_name=region,
    )
    dynamodb: Any = session.client("dynamodb", endpoint_url=dynamodb_endpoint)
    try:
        dynamodb.create_table(
            TableName=table,
            KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
            AttributeDefinitions=[
                {"AttributeName": "leaseKey", "AttributeType": "S"},
                {"AttributeName": "leaseOwner", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
            GlobalSecondaryIndexes=[
                {
                    "IndexName": LEASE_INDEX,
                    "KeySchema": [
                        {"AttributeName": "leaseOwner", "KeyType": "HASH"},
                        {"AttributeName": "leaseKey", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                }
            ],
        )
    except dynamodb.exceptions.ResourceInUseException:
        return False
    dynamodb.get_waiter("table_exists").wait(TableName=table, WaiterConfig={"Delay": 0.1, "MaxAttempts": 300})
    return True


def serve(
    args: argparse.Namespace,
    protocol_out: TextIO,
    stop_signals: set[signal.Signals],
    create_streams: Callable[[str, str, list[tuple[str, int]]], bool],
) -> int:
    """``copier local-backend --impl independent``: both servers until one of ``stop_signals`` (blocked by the
    caller) arrives; the streams and lease tables made first; ``READY kinesis=URL dynamodb=URL`` said on
    ``protocol_out``. 0 after a clean stop, 1 when a server cannot start or a stream cannot be made."""
    if args.port != DEFAULT_PORT_OF_MOTO:
        sys.stderr.write("copier local-backend: --port is for moto; the independent backend takes free ports\n")
        return 1
    try:
        with servers() as endpoints:
            if args.streams and not create_streams(endpoints.kinesis, args.region, args.streams):
                return 1
            for application in args.lease_table:
                create_lease_table(endpoints.dynamodb, application, args.region)
                sys.stderr.write(f"copier local-backend: lease table {application} created with {LEASE_INDEX}\n")
            sys.stderr.write(
                f"copier local-backend: kinesis-mock and dynalite on 127.0.0.1; give copier processes "
                f"{ENV_MARK}=independent (dynalite has no TTL: README, Local backend)\n"
            )
            print(f"READY kinesis={endpoints.kinesis} dynamodb={endpoints.dynamodb}", file=protocol_out, flush=True)
            received = signal.sigwait(stop_signals)
            sys.stderr.write(f"copier local-backend: {signal.Signals(received).name} received, stopping\n")
    except RuntimeError as error:
        sys.stderr.write(f"copier local-backend: cannot start the independent backend: {error}\n")
        return 1
    return 0
