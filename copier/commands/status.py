"""``copier status``: is every staging shard being copied? The health view, and ``--check`` for cron or a probe.

Per shard (``copier.commands.statustable`` draws the table): the KCL worker
holding it and whether that worker is alive, copier's owner and lease, the
committed position with its arrival (the replication checkpoint), how far
behind it the staging shard is, a stall its owner recorded, the counters
and the dedup window; below, redrives and repairs at work, the streams'
settings, and one line per problem (``copier.core.health`` judges them).
``--check`` prints only those lines (``ok: ...`` when there are none) and
exits 1 when there is one: a stalled shard, a shard with no live owner for
``--max-unowned`` seconds, one whose oldest record not forwarded has waited
``--max-lag`` seconds, a shard or a table that cannot be read. ``--json``
carries the same (``problems`` in each shard's object; with ``--check``, a
last object ``{"check": ...}``).

What one run reads, and what it costs (safe against production at any time,
read only): ListShards; a BatchGetItem of the shards' state items per 100
shards (never a scan: the state table also holds every shard's digest
batches) and a GetItem per shard whose owner's copier lease ran out (a
chunk left in flight); a Scan of the KCL's lease table and of its
WorkerMetricStats table (``copier.adapters.kcltables``: about 1 KB a lease,
128 read units a 1 MB page at most); and, per open shard copier has not
ended, a GetShardIterator and one GetRecords of at most one record (up to
``WAITING_READS`` when Kinesis answers empty pages), eight shards at a
time. Those two come out of each shard's budget, 5 GetShardIterator and 5
GetRecords a second, which the daemon's polling (one GetRecords a second
per shard with the sample properties; none under ``retrievalMode = FANOUT``,
whose reads come through the application's own consumer) and every other
reader of staging share: one status a minute costs a shard 1/60 of a call a
second; run ``--check`` from one place, not from every host's health probe.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from copier.core.config import Config
from copier.core.errors import AwsError
from copier.core.health import KCL_REPORT_MILLIS, Health, KclLease, Thresholds, judge, reading_from, worker_expiry_ms
from copier.core.state import ShardState, shard_key

__all__ = ["EXIT_PROBLEM", "add_arguments", "main"]

EXIT_PROBLEM = 1
READERS = 8  # shards whose staging is read at once


def _seconds(value: str) -> int:
    """A threshold in seconds (a whole or decimal number), as ms."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds of 0 or more, got {value!r}")
    return int(seconds * 1000)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``copier status``."""
    from copier.commands.cli import PROPERTIES_HELP

    limits = Thresholds()
    parser.add_argument("--properties", required=True, metavar="FILE", help=PROPERTIES_HELP)
    parser.add_argument("--json", action="store_true", help="one JSON object per shard (with --check: and a last one)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="print only the problems, one line each, and exit 1 if there is one: a stalled shard, a shard without "
        "a live owner for --max-unowned, one behind by more than --max-lag, something that cannot be read "
        "(for cron or a health probe)",
    )
    parser.add_argument(
        "--max-lag",
        type=_seconds,
        default=limits.max_lag_ms,
        metavar="SECONDS",
        help=f"a problem when a shard's oldest record not forwarded has waited longer (default "
        f"{limits.max_lag_ms // 1000}, the stack's LagAlarmMillis)",
    )
    parser.add_argument(
        "--max-unowned",
        type=_seconds,
        default=limits.max_unowned_ms,
        metavar="SECONDS",
        help=f"a problem when a shard has had no live owner for longer, counted from when its owner is known gone "
        f"(default {limits.max_unowned_ms // 1000}: a lease move or a restart takes seconds)",
    )


def main(args: argparse.Namespace) -> int:
    """The status table (or ``--check``'s lines); an AWS refusal for this host's clock is said as such, with the
    offset measured from the Date of AWS's answers (the processors on this host meet the same refusal)."""
    from copier.core.clockcheck import ClockBounds, naming_the_clock

    bounds = ClockBounds()
    try:
        return _status(args, bounds)
    except AwsError as exc:
        named = naming_the_clock(exc, bounds.snapshot())
        if named is exc:
            raise
        raise named from exc


def _report_millis(config: Config) -> int:
    """How often the KCL workers report to their WorkerMetricStats table (``workerMetricsReporterFreqInMillis``,
    a key only the daemon reads; the KCL's default when absent or not a number)."""
    from copier.core.properties import parse_properties

    found = parse_properties(Path(config.path).read_text(encoding="utf-8")).get("workerMetricsReporterFreqInMillis")
    try:
        return int(found[1]) if found is not None else KCL_REPORT_MILLIS
    except ValueError:
        return KCL_REPORT_MILLIS


def _kcl(config: Config) -> tuple[dict[str, KclLease] | None, dict[str, int] | None, list[str]]:
    """The KCL's leases and its workers' last reports, each None when it cannot be read, and why (a problem)."""
    from copier.adapters.kcltables import leases, worker_reports, worker_table

    problems: list[str] = []
    found: list[Any] = []
    for table, read, unknown in (
        (config.lease_table_name, leases, "which worker holds each shard"),
        (worker_table(config), worker_reports, "which workers are alive"),
    ):
        try:
            found.append(read(config))
        except AwsError as exc:
            found.append(None)
            absent = " (no KCL worker has started yet?)" if exc.code == "ResourceNotFoundException" else ""
            problems.append(f"the KCL table {table} cannot be read{absent}: {unknown} is not known: {exc}")
    if found[0] is None:
        found[1] = None  # a lease table that cannot be read: no shard's owner can be judged
    return found[0], found[1], problems


def _waiting(streams: Any, starts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each shard's first record from its start (``KinesisStreams.waiting``), ``READERS`` shards at a time."""
    if not starts:
        return {}
    with ThreadPoolExecutor(max_workers=min(READERS, len(starts))) as pool:
        answers = {shard_id: pool.submit(streams.waiting, shard_id, start) for shard_id, start in starts.items()}
        return {shard_id: answer.result() for shard_id, answer in answers.items()}


def health_of(
    config: Config,
    streams: Any,
    shards: list[dict[str, Any]],
    states: dict[str, ShardState],
    limits: Thresholds,
) -> tuple[dict[str, Health], list[str]]:
    """Every shard's health, and the problems that concern no one shard (a KCL table that cannot be read)."""
    leases, reports, problems = _kcl(config)
    known = leases if leases is not None else {}
    starts = {}
    for shard in shards:
        shard_id, state = shard["ShardId"], states.get(shard["ShardId"])
        lease = known.get(shard_id)
        ended = (state is not None and state.closed) or (lease is not None and lease.checkpoint == "SHARD_END")
        start = None if ended else reading_from(state, lease, config.start_ms)
        if start is not None:
            starts[shard_id] = start
    waiting = _waiting(streams, starts)
    now = time.time_ns() // 1_000_000
    expiry = worker_expiry_ms(_report_millis(config), config.clock_skew_millis)
    health = {
        s["ShardId"]: judge(
            "EndingSequenceNumber" not in s.get("SequenceNumberRange", {}),
            states.get(s["ShardId"]),
            known.get(s["ShardId"]) if leases is not None else None,
            reports,
            waiting.get(s["ShardId"]),
            now,
            expiry,
            limits,
        )
        for s in shards
    }
    return health, problems


def _status(args: argparse.Namespace, bounds: Any) -> int:
    from copier.adapters.dynamo import DynamoStateStore
    from copier.adapters.kinesis import KinesisStreams
    from copier.commands.cli import _config
    from copier.commands.sourcestatus import source_lines
    from copier.commands.statustable import owner_gone, render, rows

    config = _config(args.properties)
    store = DynamoStateStore(config, clock_bounds=bounds)
    streams = KinesisStreams(config, clock_bounds=bounds)
    shards = streams.shards(config.stream_name)
    keys = {shard_key(config.stream_name, s["ShardId"]): s["ShardId"] for s in shards}
    states = {keys[key]: state for key, state in store.get_many(keys).items()}
    limits = Thresholds(max_lag_ms=args.max_lag, max_unowned_ms=args.max_unowned)
    health, problems = health_of(config, streams, shards, states, limits)
    now = time.time_ns() // 1_000_000
    unverified = {
        shard_id
        for shard_id, state in states.items()
        if owner_gone(state, now) and store.get_batch(shard_key(config.stream_name, shard_id), state.batches + 1)
    }
    table = rows(shards, states, now, unverified, health, config.start_ms)
    problems = [f"{row.shard}: {problem}" for row in table for problem in row.problems] + problems
    if args.check:
        return _check(table, problems, args.json)
    print(render(table, as_json=args.json))
    for line in source_lines(config, store, streams, keys.values(), now, args.json):  # redrives and repairs
        print(line)
    if not args.json:
        _settings(config, streams)
        for problem in problems:
            print(f"problem: {problem}")
    return 0


def _check(table: list[Any], problems: list[str], as_json: bool) -> int:
    """``--check``: one line per problem, or one ``ok`` line; exit 1 on a problem."""
    from copier.commands.statustable import render

    ok = f"ok: {len(table)} shards: every open one owned by a live worker, none stalled, none behind the limit"
    if as_json:
        print(render(table, as_json=True))
        print(json.dumps({"check": "failed" if problems else "ok", "problems": problems}))
    else:
        print("\n".join(problems) if problems else ok)
    return EXIT_PROBLEM if problems else 0


def _settings(config: Config, streams: Any) -> None:
    """What the processors work under: the streams' distribution strategies and record limits."""
    names = [config.stream_name, config.target_stream_name, config.dead_letter_stream_name]
    for name in filter(None, names):
        found = streams.settings(name)
        if found is None:
            print(f"{name}: settings cannot be read")
        else:
            print(
                f"{name}: RecordDistributionStrategy {found.distribution}, "
                f"MaxRecordSize {found.max_record_bytes // 1024} KiB"
            )
