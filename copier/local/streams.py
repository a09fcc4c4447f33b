"""The streams a local backend starts with: ``copier local-backend --streams staging:4,target:2``.

The local flow needs its streams before ``copier init`` and ``copier run``,
and a person trying copier should not have to reach for boto3 or the AWS CLI
(which also wants credentials exported) to make them. The backend keeps
everything in memory, so they are made anew at every start: here, after the
backend answers and before it says READY, so that whatever waits for READY
finds them.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from copier.adapters.localkeys import DUMMY_ENV

__all__ = ["StreamSpec", "create_streams", "parse_streams"]

StreamSpec = tuple[str, int]  # a stream's name and its shard count

_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,128}")  # Kinesis' rule for a stream name
MAX_SHARDS = 50  # kinesis-mock's default shard limit; moto has none, a local run needs far fewer


def parse_streams(text: str) -> list[StreamSpec]:
    """``NAME[:SHARDS],...`` (one shard when left out) into specs; argparse's error for anything else."""
    specs: list[StreamSpec] = []
    for item in text.split(","):
        name, _, count = item.strip().partition(":")
        if not _NAME.fullmatch(name):
            raise argparse.ArgumentTypeError(f"{name!r} is not a stream name (letters, digits, _ . -; 1-128)")
        if not count.isdigit() and count != "":
            raise argparse.ArgumentTypeError(f"{item!r}: the shard count after ':' must be a whole number")
        shards = int(count or "1")
        if not 1 <= shards <= MAX_SHARDS:
            raise argparse.ArgumentTypeError(f"{item!r}: a stream has 1 to {MAX_SHARDS} shards here, not {shards}")
        if name in (s[0] for s in specs):
            raise argparse.ArgumentTypeError(f"{name} is given twice")
        specs.append((name, shards))
    return specs


def create_streams(endpoint: str, region: str, specs: list[StreamSpec]) -> None:
    """Create each stream on the backend at ``endpoint`` in ``region`` (moto keeps each region apart: the
    properties file's regionName must name this one) and wait until it is active."""
    import boto3

    session = boto3.session.Session(
        aws_access_key_id=DUMMY_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=DUMMY_ENV["AWS_SECRET_ACCESS_KEY"],
        region_name=region,
    )
    kinesis: Any = session.client("kinesis", endpoint_url=endpoint)
    for name, shards in specs:
        kinesis.create_stream(StreamName=name, ShardCount=shards)
    for name, _ in specs:
        kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 300})
