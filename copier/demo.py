"""``copier demo``: the whole pipeline on the embedded local backend, with a summary.

Starts the local backend, creates a staging stream (4 shards), a target
stream (2 shards) and the state table, produces events with duplicates in
them (retried batches, as Spark retries tasks), runs two ``copier run``
workers, SIGKILLs one (daemon and processors, as when a host dies) halfway
and starts a replacement, waits until every staging shard is committed,
runs ``copier verify`` against the manifest of produced IDs, and prints a
summary. Everything it started is stopped on success, failure and Ctrl-C.
Exit status: 0 when verification passes, 1 when it finds a loss or a
duplicate, 3 when the pipeline does not catch up in time.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["add_arguments", "main"]

DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=20000, help="distinct events to produce (default 20000)")
    parser.add_argument("--timeout", type=float, default=150, help="seconds to wait for the copy (default 150)")
    parser.add_argument("--workdir", help="where properties, manifest and worker logs go (default: a temp dir)")


class _Clock:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def say(self, text: str) -> None:
        sys.stdout.write(f"[{time.monotonic() - self.start:6.1f}s] {text}\n")
        sys.stdout.flush()


def main(args: argparse.Namespace) -> int:
    from copier.local.backend import LocalBackend
    from copier.local.pipeline import LocalPipeline
    from copier.local.producer import produce

    for key, value in DUMMY_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    clock = _Clock()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="copier-demo-"))
    half = args.events // 2
    clock.say(f"copier demo: {args.events} events, files in {workdir}")
    backend = LocalBackend().start()
    clock.say(f"local backend (Kinesis + DynamoDB) on {backend.endpoint}")
    pipeline = LocalPipeline(backend.endpoint, workdir)

    def progress() -> None:
        c = pipeline.counters()
        alive = " ".join(f"{w.name}:{'up' if w.alive else 'down'}" for w in pipeline.workers)
        clock.say(
            f"workers {alive} | forwarded {c.get('forwarded', 0)}/{args.events} | "
            f"duplicates dropped {c.get('duplicates', 0)} | replays dropped {c.get('replays', 0)}"
        )

    try:
        pipeline.create(staging_shards=4, target_shards=2)
        clock.say("created staging (4 shards), target (2 shards) and the state table")
        head = args.events // 4
        produced = produce(pipeline.kinesis, pipeline.staging, head, run="demo", seed=1)
        clock.say(f"produced {head} events ({produced.records} staging records); the rest follows while copying")
        workers = [pipeline.start_worker("a"), pipeline.start_worker("b")]
        clock.say("started workers a and b (copier run: the KCL MultiLangDaemon); the KCL takes ~10-40 s to start")
        if not pipeline.wait(lambda: pipeline.counters().get("forwarded", 0) > 0, args.timeout, progress):
            clock.say("the copy did not start in time; see the worker logs in " + str(workdir))
            return 3
        rest = args.events - head
        producer = threading.Thread(
            target=produce,
            args=(pipeline.kinesis, pipeline.staging, rest),
            kwargs={"run": "demo", "seed": 2, "start": head, "out": produced, "pause_s": 20.0 / max(1, rest / 500)},
            daemon=True,
        )
        producer.start()
        if not pipeline.wait(lambda: pipeline.counters().get("forwarded", 0) >= half, args.timeout, progress):
            clock.say("the copy stalled; see the worker logs in " + str(workdir))
            return 3
        workers[0].kill_host()
        clock.say("SIGKILLed worker a (daemon and processors) halfway; starting worker c")
        pipeline.start_worker("c")
        producer.join()
        clock.say(f"produced all {args.events} events: {produced.records} staging records")
        if not pipeline.wait(lambda: pipeline.caught_up(produced.last), args.timeout, progress):
            progress()
            clock.say("the target did not catch up in time; see the worker logs in " + str(workdir))
            return 3
        progress()
        manifest = workdir / "manifest.txt"
        manifest.write_text("\n".join(produced.manifest) + "\n")
        clock.say("caught up; running copier verify")
        verify = subprocess.run(
            [pipeline.copier_bin, "verify", "--properties", str(pipeline.properties), "--manifest", str(manifest)],
            capture_output=True,
            text=True,
        )
        sys.stdout.write(verify.stdout)
        found = re.search(r"^target: (\d+) records", verify.stdout, re.M)
        counts = re.search(r"^lost: (\d+), duplicated: (\d+)", verify.stdout, re.M)
        elapsed = time.monotonic() - clock.start
        lines = [
            "",
            "summary",
            f"  unique events produced      {len(set(produced.manifest))}",
            f"  staging records (with dups) {produced.records}",
            f"  target records              {found.group(1) if found else '?'}",
            f"  lost                        {counts.group(1) if counts else '?'}",
            f"  duplicated                  {counts.group(2) if counts else '?'}",
            f"  verify                      {'OK' if verify.returncode == 0 else 'FAILED'}",
            f"  time taken                  {elapsed:.1f}s",
        ]
        sys.stdout.write("\n".join(lines) + "\n")
        if verify.returncode != 0:
            sys.stderr.write(verify.stderr)
        return 0 if verify.returncode == 0 else 1
    except KeyboardInterrupt:
        clock.say("interrupted: stopping everything")
        return 130
    finally:
        pipeline.stop_all()
        backend.stop()
        clock.say("stopped workers and the local backend")
