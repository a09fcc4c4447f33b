"""Starting and stopping the test backend, and small AWS helpers the tests share."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3

from copier.local.backend import DUMMY_ENV, spawned

ROOT = Path(__file__).resolve().parents[2]
__all__ = ["DUMMY_ENV", "ROOT", "client", "create_stream", "free_port", "local_backend", "read_stream"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def local_backend(**extra_env: str) -> Iterator[str]:
    """The project's local backend (``copier local-backend``) in a process of its own, with dummy credentials."""
    with spawned(**DUMMY_ENV, **extra_env) as endpoint:
        yield endpoint


def client(service: str, endpoint: str) -> Any:
    return boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    ).client(service, endpoint_url=endpoint)


def create_stream(kinesis: Any, name: str, shards: int) -> None:
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100})


def read_stream(kinesis: Any, name: str) -> list[dict[str, Any]]:
    """Every record in every shard of a stream, from the start."""
    out: list[dict[str, Any]] = []
    for shard in kinesis.list_shards(StreamName=name)["Shards"]:
        it = kinesis.get_shard_iterator(StreamName=name, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")[
            "ShardIterator"
        ]
        while it:
            page = kinesis.get_records(ShardIterator=it, Limit=10000)
            out.extend(page["Records"])
            if not page["Records"]:
                break
            it = page.get("NextShardIterator")
    return out
