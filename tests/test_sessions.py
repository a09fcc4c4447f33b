"""Every botocore client of a process shares one data loader, so each service model is loaded once.

Measured before this: an idle ``copier process`` held 74 MB RSS, about 19 MB
of it four copies of the Kinesis and DynamoDB models and endpoint rules (one
per boto3 session and one in PynamoDB's own); docs/benchmarks.md has the
numbers. These tests hold the sharing in place: a client made anywhere on the
processor's path gets its models from the host session's loader.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from copier.adapters.dynamo import DynamoStateStore
from copier.adapters.kinesis import KinesisStreams
from copier.adapters.sessions import host_session, share_loader
from copier.adapters.target import target_session
from copier.core.config import load_config
from copier.local.backend import DUMMY_ENV
from tests.conftest import Pipeline


def _loader_of(client: object) -> object:
    return client._loader  # type: ignore[attr-defined]  # botocore keeps the loader that built the client


def test_the_processors_clients_all_load_from_the_host_sessions_loader(pipeline: Pipeline) -> None:
    config = load_config(pipeline.properties)
    shared = host_session().get_component("data_loader")
    store = DynamoStateStore(config)
    assert store.get("no/such-shard") is None  # PynamoDB makes its client on this first call
    pynamodb_session = store.model._get_connection().connection.session
    assert pynamodb_session.get_component("data_loader") is shared
    fast = store._lean()
    assert fast is not None
    streams = KinesisStreams(config)
    for client in (streams._put, streams._read, streams._staging):
        assert _loader_of(client) is shared
    assert streams.shards(pipeline.staging), "the shared clients work"


def test_a_target_role_gets_credentials_of_its_own_and_the_same_models(pipeline: Pipeline) -> None:
    config = load_config(pipeline.properties)
    assert target_session(config) is host_session(), "no role: the host's own session"
    role = dataclasses.replace(config, target_role_arn="arn:aws:iam::123456789012:role/copier-target")
    session = target_session(role)
    assert session is not host_session()
    assert session.get_component("data_loader") is host_session().get_component("data_loader")
    assert session.get_credentials() is not host_session().get_credentials(), "its own (assumed) credentials"
    assert share_loader(session) is session, "sharing again changes nothing"


_PROBE = """
import json, sys
from copier.adapters.logs import configure_logging
from copier.commands.cli import _processor_clients
from copier.core.clockcheck import ClockBounds
from copier.core.config import load_config

config = load_config(sys.argv[1])
configure_logging("INFO")  # to stderr, as in copier process
store, streams = _processor_clients(config, ClockBounds())
assert store.get("no/such-shard") is None
shards = streams.shards(config.stream_name)
print(json.dumps({"store": type(store).__name__, "shards": len(shards),
                  "botocore": sorted(m for m in sys.modules if m.split(".")[0] in ("botocore", "boto3", "pynamodb"))}))
"""


def _probe(pipeline: Pipeline, tmp_path: Path, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    environ.update(DUMMY_ENV, HOME=str(tmp_path), **env)
    run = subprocess.run(
        [sys.executable, "-c", _PROBE, str(pipeline.properties)],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result: dict[str, object] = json.loads(run.stdout)
    result["stderr"] = run.stderr
    return result


def test_a_processor_on_the_lean_path_loads_no_botocore(pipeline: Pipeline, tmp_path: Path) -> None:
    """Keys in the environment and copier's own endpoints: the state store and the streams without botocore,
    boto3 or PynamoDB in the process (what took an idle processor from 55 MB to 30 MB)."""
    lean = _probe(pipeline, tmp_path)
    assert lean["store"] == "LeanStateStore" and lean["shards"] == 1
    assert lean["botocore"] == [], lean["botocore"]


def test_a_setting_the_lean_path_does_not_cover_keeps_botocore_and_says_why(pipeline: Pipeline, tmp_path: Path) -> None:
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "config").write_text("[default]\nregion = us-east-1\n")
    kept = _probe(pipeline, tmp_path)
    assert kept["store"] == "DynamoStateStore" and kept["shards"] == 1
    assert "botocore" in kept["botocore"]
    assert "botocore_clients" in str(kept["stderr"]) and f"{tmp_path / '.aws' / 'config'} exists" in str(kept["stderr"])
