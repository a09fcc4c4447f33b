"""The local moto backend serves requests one at a time, first come first served, and can run in a process of
its own: a put it received must not wait behind later requests, nor on its caller's threads, past the put
timeout (the protocol's bound; docs/protocol.md, Assumptions)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import boto3

from copier.local.backend import DUMMY_ENV, FifoLock
from copier.local.independent import running


def test_the_lock_lets_waiters_in_in_the_order_they_asked() -> None:
    """Twelve threads ask for the lock one after another while it is held: they get it in that order (a plain
    lock lets any waiter in, and the last to ask may go first)."""
    lock = FifoLock()
    order: list[int] = []
    threads = []
    with lock:
        for n in range(12):
            asked = lock._next + 1

            def enter(n: int = n) -> None:
                with lock:
                    order.append(n)
                    time.sleep(0.001)

            thread = threading.Thread(target=enter)
            thread.start()
            threads.append(thread)
            while lock._next < asked:  # it has drawn its ticket and waits
                time.sleep(0.001)
    for thread in threads:
        thread.join(10)
    assert order == list(range(12))


def _children_serving() -> list[str]:
    """This process's children that run ``copier local-backend`` (pid and command line)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and "local-backend" in cmdline:
            found.append(f"{proc.name} {cmdline}")
    return found


def test_moto_in_a_process_of_its_own_serves_and_is_stopped_with_the_block() -> None:
    """``running("moto", own_process=True)``: a child process serves the endpoint, and is gone after the block."""
    before = set(_children_serving())  # other tests' backends, still running for their fixtures
    with running("moto", own_process=True) as backend:
        ours = set(_children_serving()) - before
        assert len(ours) == 1, "no copier local-backend child of its own"
        kinesis = boto3.client("kinesis", endpoint_url=backend.kinesis, region_name="us-east-1", **_keys())
        kinesis.create_stream(StreamName="s", ShardCount=1)
        assert kinesis.list_streams()["StreamNames"] == ["s"]
    assert not ours & set(_children_serving())


def _keys() -> dict[str, str]:
    return {
        "aws_access_key_id": DUMMY_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": DUMMY_ENV["AWS_SECRET_ACCESS_KEY"],
    }
