"""Starting and stopping the test backend, and small AWS helpers the tests share."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
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
def moto_server(**extra_env: str) -> Iterator[str]:
    """Run the single-threaded moto server; yields its endpoint URL; always stops it."""
    port = free_port()
    env = {**os.environ, **DUMMY_ENV, **extra_env}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.motoserver", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start on port {port}") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
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
