"""Every botocore client of a process shares one data loader, so each service model is loaded once.

Measured before this: an idle ``copier process`` held 74 MB RSS, about 19 MB
of it four copies of the Kinesis and DynamoDB models and endpoint rules (one
per boto3 session and one in PynamoDB's own); docs/benchmarks.md has the
numbers. These tests hold the sharing in place: a client made anywhere on the
processor's path gets its models from the host session's loader.
"""

from __future__ import annotations

import dataclasses

from copier.adapters.dynamo import DynamoStateStore
from copier.adapters.kinesis import KinesisStreams
from copier.adapters.sessions import host_session, share_loader
from copier.adapters.target import target_session
from copier.core.config import load_config
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
    fast = store._fast_client()
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
