"""``copier demo``: the whole pipeline on the embedded local backend, with a summary.

Starts the local backend, creates a staging stream (4 shards), a target
stream (2 shards) and the state table, and writes a directory of JSON-lines
events (a few of them delivered twice upstream). The PySpark job
(``copier produce``, local mode) writes them to the staging stream; it is
SIGKILLed in the middle of a micro-batch and restarted from its checkpoint,
so the interrupted micro-batch is written again (Spark's at-least-once).
Two ``copier run`` workers copy the staging stream; while the producer
has written only 30%, the worker owning the most shards is SIGKILLed
(daemon and processors, as when a host dies) and a replacement started;
the demo says which worker took over each of its shards and how long after
the kill. Once every staging shard is committed, ``copier verify`` audits
the target against the IDs in the input, and a summary is printed.
Everything it started is stopped on success, failure and Ctrl-C; its
temporary directory is removed after a success (kept after a failure, for
its logs; never with ``--workdir``). Exit
status: 0 when verification passes, 1 when it finds a loss or a duplicate,
3 when the pipeline does not finish in time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "main"]


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


def _show_takeovers(
    pipeline: Any,
    shards: list[str],
    victim: str,
    since: float,
    timeout: float,
    clock: _Clock,
    progress: Callable[[], None],
) -> bool:
    """Wait until every shard the killed worker owned has an owner among the live workers, saying for each
    which worker took it over and how long after the kill."""
    waiting = set(shards)
    deadline = since + timeout
    while waiting and time.monotonic() < deadline:
        owners = pipeline.owners()
        for shard in sorted(waiting):
            owner = owners.get(shard)
            if owner is not None and owner != victim:
                clock.say(f"{shard}: taken over by worker {owner}, {time.monotonic() - since:.1f}s after the kill")
                waiting.discard(shard)
        if waiting:
            time.sleep(1.0)
    progress()
    return not waiting


def write_input(directory: Path, events: int, per_file: int = 1000, redelivered: float = 0.03) -> list[str]:
    """JSON-lines files of ``events`` events; a fraction is delivered again in a later file.

    Returns the distinct event IDs in production order: the manifest the
    target is audited against.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ids = [f"evt-demo-{n:08d}" for n in range(events)]
    again = ids[:: max(1, round(1 / redelivered))] if redelivered > 0 else []
    rows = [*ids, *again]
    for index, first in enumerate(range(0, len(rows), per_file)):
        lines = [
            json.dumps(
                {"eventId": i, "user": f"user-{int(i[-8:]) % 1000}", "amount": int(i[-8:]) % 500, "kind": "demo"}
            )
            for i in rows[first : first + per_file]
        ]
        (directory / f"part-{index:05d}.json").write_text("\n".join(lines) + "\n")
    return ids


def main(args: argparse.Namespace) -> int:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        sys.stderr.write("copier demo: the producer is a PySpark job: install copier[spark] (make install does)\n")
        return 3
    from copier.local.backend import DUMMY_ENV, LocalBackend
    from copier.local.pipeline import LocalPipeline

    for key, value in DUMMY_ENV.items():
        os.environ.setdefault(key, value)
    clock = _Clock()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="copier-demo-"))
    clock.say(f"copier demo: {args.events} events, files in {workdir}")
    backend = LocalBackend().start()
    clock.say(f"local backend (Kinesis + DynamoDB) on {backend.endpoint}")
    pipeline = LocalPipeline(backend.endpoint, workdir)

    def progress() -> None:
        """One line: the producer, each worker with the shards it owns, and what the copy has committed (the
        state table's counters: events forwarded and committed, duplicates and replays dropped)."""
        c = pipeline.counters()
        owned = pipeline.shards_owned()
        workers = " ".join(f"{w.name}:{owned.get(w.name, 0) if w.alive else 'down'}" for w in pipeline.workers)
        producers = pipeline.producers
        spark = "writing" if producers and producers[-1].poll() is None else "stopped"
        clock.say(
            f"producer {spark} | shards per worker {workers} | committed {c.get('forwarded', 0)} forwarded, "
            f"{c.get('duplicates', 0)} duplicates and {c.get('replays', 0)} replays dropped"
        )

    ok = False
    try:
        pipeline.create(staging_shards=4, target_shards=2)
        clock.say("created staging (4 shards), target (2 shards) and the state table")
        manifest_ids = write_input(workdir / "input", args.events)
        clock.say(f"wrote {args.events} events (3% delivered twice upstream) as JSON lines in {workdir / 'input'}")
        checkpoint = workdir / "spark-checkpoint"
        options = ("--id-column", "eventId", "--max-files-per-trigger", "5")
        producer = pipeline.start_producer(workdir / "input", checkpoint, *options)
        pipeline.start_worker("a")
        pipeline.start_worker("b")
        clock.say("started the PySpark producer and workers a and b (copier run: the KCL MultiLangDaemon)")
        # 30%: inside the second micro-batch of 5,000 rows, so that its restart writes rows again
        if not pipeline.wait(lambda: pipeline.staging_records() >= args.events * 3 // 10, args.timeout, progress):
            clock.say(f"the producer wrote nothing in time; see {workdir / 'producer.log'}")
            return 3
        pipeline.kill_producer(producer)
        producer = pipeline.start_producer(workdir / "input", checkpoint, *options)
        clock.say("SIGKILLed the PySpark job mid-micro-batch; restarted it from its checkpoint")
        # Kill a worker while it owns shards and most events are still to come (the producer has written 30%).
        if not pipeline.wait(lambda: any(pipeline.shards_owned().values()), args.timeout, progress):
            clock.say("no worker took a shard; see the worker logs in " + str(workdir))
            return 3
        victim = pipeline.busiest_worker()
        moved = sorted(s for s, owner in pipeline.owners().items() if owner == victim.name)
        victim.kill_host()
        killed = time.monotonic()
        clock.say(f"SIGKILLed worker {victim.name} (daemon and processors), owner of {', '.join(moved)}; starting c")
        pipeline.start_worker("c")
        if not _show_takeovers(pipeline, moved, victim.name, killed, args.timeout, clock, progress):
            clock.say("the killed worker's shards were not taken over in time; see the worker logs in " + str(workdir))
            return 3
        if not pipeline.wait(lambda: producer.poll() is not None, args.timeout, progress):
            clock.say(f"the producer did not finish in time; see {workdir / 'producer.log'}")
            return 3
        if producer.returncode != 0:
            clock.say(f"the producer failed ({producer.returncode}); see {workdir / 'producer.log'}")
            return 3
        tips = pipeline.staging_tips()
        staging_records = pipeline.staging_records()
        clock.say(f"the producer finished: {staging_records} staging records")
        if not pipeline.wait(lambda: pipeline.caught_up(tips), args.timeout, progress):
            progress()
            clock.say("the target did not catch up in time; see the worker logs in " + str(workdir))
            return 3
        progress()
        clock.say("caught up; running copier verify")
        verify = pipeline.verify(manifest_ids)
        sys.stdout.write(verify.stdout)
        found = re.search(r"^target: (\d+) records", verify.stdout, re.M)
        counts = re.search(r"^lost: (\d+), duplicated: (\d+)", verify.stdout, re.M)
        elapsed = time.monotonic() - clock.start
        lines = [
            "",
            "summary",
            f"  unique events produced      {len(manifest_ids)}",
            f"  staging records (with dups) {staging_records}",
            f"  target records              {found.group(1) if found else '?'}",
            f"  lost                        {counts.group(1) if counts else '?'}",
            f"  duplicated                  {counts.group(2) if counts else '?'}",
            f"  verify                      {'OK' if verify.returncode == 0 else 'FAILED'}",
            f"  time taken                  {elapsed:.1f}s",
        ]
        sys.stdout.write("\n".join(lines) + "\n")
        if verify.returncode != 0:
            sys.stderr.write(verify.stderr)
        ok = verify.returncode == 0
        return 0 if ok else 1
    except KeyboardInterrupt:
        clock.say("interrupted: stopping everything")
        return 130
    finally:
        pipeline.stop_all()
        backend.stop()
        clock.say("stopped workers and the local backend")
        if args.workdir is None and ok:
            shutil.rmtree(workdir, ignore_errors=True)  # kept after a failure: its logs say why
            clock.say(f"removed {workdir}")
