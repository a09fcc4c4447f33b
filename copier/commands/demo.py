"""``copier demo``: the whole pipeline on the embedded local backend, with a summary.

Starts the local backend (moto, or with ``--impl independent`` kinesis-mock and dynalite: then the KCL's
lease table is made first and the copier processes are told the state table has no TTL, as README's
"Local backend" says), creates a staging stream (4 shards), a target
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
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=20000, help="distinct events to produce (default 20000)")
    parser.add_argument("--timeout", type=float, default=150, help="seconds to wait for the copy (default 150)")
    parser.add_argument("--workdir", help="where properties, manifest and worker logs go (default: a temp dir)")
    parser.add_argument(
        "--impl",
        choices=("moto", "independent"),
        default="moto",
        help="the local backend, as copier local-backend --impl: moto (default) or independent (kinesis-mock and "
        "dynalite; slower: give fewer --events)",
    )


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
    for shard in sorted(waiting):
        clock.say(f"{shard}: not seen taken over {time.monotonic() - since:.1f}s after the kill")
    return not waiting


def killed_shards(owners: Mapping[str, str | None], victim: str) -> tuple[list[str], list[str]]:
    """The shards a kill of ``victim`` concerns, from one reading of the owners: those it holds, and those
    moving (between two owners: the KCL moves leases about, and which two a move is between does not show),
    which it may have been handing on or taking over. Both must be seen taken over by a live worker."""
    held = sorted(shard for shard, owner in owners.items() if owner == victim)
    moving = sorted(shard for shard, owner in owners.items() if owner is None)
    return held, moving


def kill_line(victim: str, held: list[str], moving: list[str]) -> str:
    """What the kill line says: every shard the killed worker held, and every one moving at that moment."""
    of = f"owner of {', '.join(held)}" if held else "owner of no shard"
    between = f"; moving at the kill: {', '.join(moving)}" if moving else ""
    return f"SIGKILLed worker {victim} (daemon and processors), {of}{between}; starting c"


LEGEND = (
    "each progress line: the producer, and the records staging holds (duplicates included); the shards each "
    "worker holds, and those moving (between two owners while the KCL moves a lease: its owner changes so far in "
    "brackets); what the copiers have committed, from the state table"
)


def progress_line(
    producer: str,
    staging: int,
    workers: list[tuple[str, bool]],
    owners: Mapping[str, str | None],
    moves: int,
    counters: Mapping[str, int],
) -> str:
    """A progress line (see :data:`LEGEND`). ``owners``: each open shard's worker, None between owners
    (``copier.local.pipeline.shard_owner``), so the shards held and moving add up to all of them."""
    held = Counter(owner for owner in owners.values() if owner is not None)
    moving = sum(owner is None for owner in owners.values())
    shards = " ".join(f"{name}:{held.get(name, 0) if alive else 'down'}" for name, alive in workers)
    return (
        f"producer {producer}, staging holds {staging} | shards {shards}, moving {moving} ({moves} moves) | "
        f"committed {counters.get('forwarded', 0)} forwarded, {counters.get('duplicates', 0)} duplicates and "
        f"{counters.get('replays', 0)} replays dropped"
    )


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


def _report(stdout: str) -> dict[str, Any] | None:
    """The JSON report ``copier verify --json`` printed (its one line on stdout), or None if there is none."""
    for line in reversed(stdout.splitlines()):
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict):
            return report
    return None


def _verdict(report: dict[str, Any]) -> str:
    if report["ok"] and report["complete"]:
        return "OK"
    if report["ok"]:
        return f"PENDING ({report['pending'] + report['pending_without_id']} events not copied yet)"
    return "FAILED"


def verify_summary(
    pipeline: Any, manifest_ids: list[str], staging_records: int, started: float
) -> tuple[bool, list[str]]:
    """Run ``copier verify --json`` against the manifest; whether every event is in the target exactly once,
    and the summary's lines, read from verify's JSON report (its text is for people, and changes)."""
    verify = pipeline.verify(manifest_ids, "--json")
    report = _report(verify.stdout)
    elapsed = time.monotonic() - started
    if report is None:  # verify failed before its report (exit 2 or 3): its error says why
        sys.stderr.write(verify.stderr)
        return False, ["", f"copier verify exited {verify.returncode} without a report (above)"]
    rows = {
        "unique events produced": len(manifest_ids),
        "staging records (with dups)": staging_records,
        "target records": report["target_records"],
        "lost": report["lost"] + report["lost_without_id"],
        "duplicated": report["duplicated"],
        "verify": _verdict(report),
        "time taken": f"{elapsed:.1f}s",
    }
    examples = {kind: shown for kind, shown in report["examples"].items() if shown}
    if examples:  # what went wrong, as verify names it
        rows["examples"] = json.dumps(examples)
    lines = ["", "summary", *(f"  {name:<28}{value}" for name, value in rows.items())]
    return bool(report["ok"] and report["complete"]), lines


def main(args: argparse.Namespace) -> int:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        sys.stderr.write("copier demo: the producer is a PySpark job: install copier[spark] (make install does)\n")
        return 3
    from copier.local.backend import DUMMY_ENV
    from copier.local.independent import ENV_MARK, running
    from copier.local.pipeline import LocalPipeline

    for key, value in DUMMY_ENV.items():
        os.environ.setdefault(key, value)
    if args.impl == "independent":  # its copier processes are told dynalite has no TTL
        os.environ[ENV_MARK] = "independent"
    clock = _Clock()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="copier-demo-"))
    clock.say(f"copier demo: {args.events} events, files in {workdir}")
    backend = contextlib.ExitStack()
    endpoints = backend.enter_context(running(args.impl, lease_tables=(LocalPipeline.application,)))
    if endpoints.kinesis == endpoints.dynamodb:
        clock.say(f"local backend ({args.impl}: Kinesis + DynamoDB) on {endpoints.kinesis}")
    else:
        clock.say(f"local backend ({args.impl}): Kinesis on {endpoints.kinesis}, DynamoDB on {endpoints.dynamodb}")
    pipeline = LocalPipeline(endpoints.kinesis, workdir, dynamodb_endpoint=endpoints.dynamodb)

    def progress() -> None:
        """One line: the producer and what staging holds, the shards each worker holds, what is committed."""
        states = pipeline.shard_states()
        producers = pipeline.producers
        clock.say(
            progress_line(
                "writing" if producers and producers[-1].poll() is None else "stopped",
                pipeline.staging_records(),
                [(w.name, w.alive) for w in pipeline.workers],
                pipeline.owners(states),
                sum(max(state.epoch - 1, 0) for state in states.values()),
                pipeline.counters(states),
            )
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
        clock.say(LEGEND)
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
        held, moving = killed_shards(pipeline.owners(), victim.name)
        victim.kill_host()
        killed = time.monotonic()
        clock.say(kill_line(victim.name, held, moving))
        pipeline.start_worker("c")
        if not _show_takeovers(pipeline, held + moving, victim.name, killed, args.timeout, clock, progress):
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
        ok, lines = verify_summary(pipeline, manifest_ids, staging_records, clock.start)
        sys.stdout.write("\n".join(lines) + "\n")
        return 0 if ok else 1
    except KeyboardInterrupt:
        clock.say("interrupted: stopping everything")
        return 130
    finally:
        pipeline.stop_all()
        backend.close()
        clock.say("stopped workers and the local backend")
        if args.workdir is None and ok:
            shutil.rmtree(workdir, ignore_errors=True)  # kept after a failure: its logs say why
            clock.say(f"removed {workdir}")
