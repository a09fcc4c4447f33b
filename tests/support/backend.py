"""Starting and stopping the test backend, and small AWS helpers the tests share."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3

ROOT = Path(__file__).resolve().parents[2]
DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def local_backend(**extra_env: str) -> Iterator[str]:
    """Run the project's local backend (``copier local-backend``) on 127.0.0.1; yield its URL; always stop it.

    It runs in a process of its own so that moto's settings can come from
    ``extra_env`` (the cost test turns moto's request recorder on).
    """
    env = {**os.environ, **DUMMY_ENV, **extra_env}
    proc = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "copier"), "local-backend", "--port", str(free_port())],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().split()
        if len(ready) != 2 or ready[0] != "READY":
            raise RuntimeError(f"the local backend did not start (status {proc.poll()}): {ready}")
        yield ready[1]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
