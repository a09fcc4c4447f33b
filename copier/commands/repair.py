"""``copier repair``: put back exactly the events ``copier verify`` reports lost in a range, then audit again.

A copier source like the staging stream (docs/protocol.md, "Repairing a
range"). A run takes every staging shard's repair item over
(``repair:<stream>/<shard>``, ``copier.shard.source``): a second run started
meanwhile fences it, and a chunk a killed run left in flight is verified in
the target before anything else. Then it audits as ``copier verify`` does
(``copier.commands.verify.run_verify``: the committed positions read first,
then the target and dead-letter stream, then staging), decides which lost
events of the range go now (``copier.core.repair.decide``: never one a live
copier may still forward, nor one whose producer retries the live window may
still let through), reads their records back from staging as the daemon
delivers them, and puts them through the per-shard protocol (intent before
each put, ambiguous puts verified). Last, it audits again and prints
``copier verify``'s report. Events in the target that staging never had are
reported there (``unexpected``); nothing is ever deleted.

``--dry-run`` audits and says what would go and what waits; it writes
nothing. Exit status: 0 the audit after the repair is OK and nothing of the
range waits; 1 otherwise (events that wait or cannot be put are listed, the
report says what is still lost or duplicated); 2 bad arguments or
properties; 3 a fatal AWS error; 130 interrupted (after the chunk in
flight: run it again).
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

from copier.adapters.localkeys import command_config
from copier.adapters.progress import ReadingProgress, RunProgress
from copier.adapters.sourcemetrics import SourceMetrics
from copier.adapters.streamreader import StreamReader, make_client
from copier.commands.export import _instant_ms
from copier.commands.redrive import EXIT_INTERRUPTED, stopping
from copier.commands.verify import StagedRecord, redriven_letters, run_verify
from copier.core.audit import PAST_THE_END
from copier.core.auditinputs import read_reports
from copier.core.audittypes import DuplicateReport
from copier.core.config import Config
from copier.core.identity import EventValue
from copier.core.plan import SourceRecord
from copier.core.ports import Clock, Streams
from copier.core.positions import Position
from copier.core.repair import Copy, Decision, LiveShard, decide, plan_repair
from copier.core.shardmap import ShardMap
from copier.core.state import StateStore, shard_key
from copier.core.verifyreport import VerifyResult, render_text
from copier.shard.retention import MIN_RETENTION_MS
from copier.shard.source import SourceShard
from copier.shard.worker import SystemClock

__all__ = ["PREFIX", "RepairRun", "add_arguments", "main"]

PREFIX = "repair:"
ALL = 10**12  # examples: every lost event, so that each can be put
PAGE = 2000  # lost records a forward: progress, and an interrupt, between two (a chunk: at most 10,000)
EXAMPLES = 5  # what the summary lists of the events put


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``copier repair``."""
    parser.add_argument("--properties", required=True, metavar="FILE", help="the copier's properties file")
    when = "epoch ms, ISO 8601, relative (-2h, -30m, -1d) or now"
    parser.add_argument(
        "--since",
        type=_instant_ms,
        required=True,
        metavar="TIME",
        help=f"events whose first staging copy arrived at or after ({when})",
    )
    parser.add_argument("--until", type=_instant_ms, required=True, metavar="TIME", help=f"and before ({when})")
    parser.add_argument("--dry-run", action="store_true", help="audit and say what would be put; write nothing")
    parser.add_argument(
        "--reports",
        metavar="FILE",
        help="the copier's log lines: possible_duplicates reports excuse copies in the audits (as copier verify's)",
    )
    parser.add_argument("--examples", type=int, default=5, metavar="N", help="examples the final report shows")


@dataclass
class RepairRun:
    """One run of ``copier repair``: :meth:`run` returns the audit after the repair (None for a dry run)."""

    config: Config
    store: StateStore
    streams: Streams
    reader: StreamReader
    target_reader: StreamReader
    since_ms: int | None
    until_ms: int | None
    dry_run: bool = False
    reports: Sequence[DuplicateReport] = ()
    examples: int = 5
    progress: RunProgress | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    metrics: SourceMetrics | None = None
    make_shard: Callable[..., SourceShard] = SourceShard
    clock: Clock = field(default_factory=SystemClock)
    decisions: list[Decision] = field(default_factory=list)  # the lost events of the range, before the repair
    after: list[Decision] = field(default_factory=list)  # and after it
    not_found: list[Decision] = field(default_factory=list)  # lost, and not a record the daemon delivers
    taken_over: list[str] = field(default_factory=list)
    put: int = 0
    interrupted: bool = False
    live: dict[str, LiveShard] = field(default_factory=dict)
    unknown: str | None = None  # why the committed positions could not be read

    def run(self) -> VerifyResult | None:
        listed = self.reader.shards(self.config.stream_name)
        key_shard = ShardMap.of(listed).shard_for
        shards: dict[str, SourceShard] = {}
        if not self.dry_run:  # before the audit: what another run put, or left in flight, is in what it reads
            for shard in listed:
                session = self.make_shard(self.config, self.store, self.streams, PREFIX, plan_repair, window=False)
                if session.start(shard["ShardId"]):
                    shards[shard["ShardId"]] = session
                else:
                    self.taken_over.append(shard["ShardId"])
        staged: list[StagedRecord] = []
        first = self._audit(ALL, staged)
        self.unknown = first.positions_unknown  # then every event waits: none is known to be passed
        self.decisions = self._decide(first, staged, key_shard)
        if self.dry_run:
            return None
        self._put(shards)
        for shard_id, session in shards.items():  # between chunks: nothing in flight
            if not session.fenced:
                session.finish()
                if self.metrics is not None:
                    self.metrics.sent(shard_id, 0, done=True)
        if self.interrupted:
            return None
        staged = []
        final = self._audit(ALL, staged)
        self.after = self._decide(final, staged, key_shard)
        return _trimmed(final, self.examples)

    def _audit(self, examples: int, staged: list[StagedRecord] | None) -> VerifyResult:
        """``copier verify``'s audit, the live shards' committed positions (and newest arrivals) read first."""

        def committed(shard_ids: Sequence[str]) -> Mapping[str, Position]:
            keys = {shard_key(self.config.stream_name, s): s for s in shard_ids}
            positions: dict[str, Position] = {}
            for key, state in self.store.get_many(keys).items():
                done = PAST_THE_END if state.closed else state.position
                self.live[keys[key]] = LiveShard(done, state.window_newest_ms)
                if done is not None:
                    positions[keys[key]] = done
            return positions

        self.live.clear()
        redriven = redriven_letters(self.config, self.target_reader)
        return run_verify(
            self.config, None, examples, self.reader, self.target_reader, self.reports, committed, redriven, staged
        )

    def _decide(
        self, audited: VerifyResult, staged: Iterable[StagedRecord], key_shard: Callable[[str], str | None]
    ) -> list[Decision]:
        """The lost events of the range (every one the audit lists: ``examples`` was all), with their copies."""
        by_id: dict[EventValue, list[Copy]] = {}
        at: dict[tuple[str, int, int], Copy] = {}
        for record in staged:
            for event in record.events:
                assert event.position is not None
                place = Position(event.position[1], event.position[2])
                copy = Copy(record.shard_id, place, record.arrival_ms, event.partition_key or "")
                at[event.position] = copy
                if event.event_id is not None:
                    by_id.setdefault(event.event_id, []).append(copy)
        report = audited.report
        keyed = {i: by_id[i] for i in report.lost_examples if i in by_id}
        unkeyed = [at[p] for p in map(_place, report.unkeyed_lost_examples) if p in at]
        c = self.config
        window, margin = c.dedup_window_ms, c.clock_skew_millis
        kept = self._kept_since()
        return decide(keyed, unkeyed, self.live, key_shard, window, margin, self.since_ms, self.until_ms, kept)

    def _kept_since(self) -> int:
        """The kept horizon (``copier.core.repair``): now less the shortest retention of the streams a delivered
        copy is in (the target; the dead-letter stream), plus the clock margin. A retention that cannot be read
        counts as Kinesis' shortest."""
        c = self.config
        streams = [c.target_stream_name] + ([c.dead_letter_stream_name] if c.dead_letter_stream_name else [])
        kept = min(self.streams.retention(s) or MIN_RETENTION_MS for s in streams)
        return self.clock.now_ms() - kept + c.clock_skew_millis

    def _put(self, shards: Mapping[str, SourceShard]) -> None:
        """Read each shard's lost records back from staging and put them through its repair session."""
        wanted: dict[str, set[Position]] = {}
        for d in self.decisions:
            if d.put is not None:
                wanted.setdefault(d.put.shard_id, set()).add(d.put.position)
        total = sum(len(p) for p in wanted.values())
        for shard_id, positions in sorted(wanted.items()):
            session = shards.get(shard_id)
            if session is None:
                continue
            found = self._read_back(shard_id, positions)
            missing = positions - {r.position for r in found}
            gone = [d for d in self.decisions if d.put and d.put.shard_id == shard_id and d.put.position in missing]
            self.not_found += gone
            for i in range(0, len(found), PAGE):
                session.forward(found[i : i + PAGE])
                if session.fenced:
                    self.taken_over.append(shard_id)
                    break
                sent = len(found[i : i + PAGE])
                self.put += sent
                if self.metrics is not None:
                    self.metrics.sent(shard_id, sent)
                if self.progress is not None:
                    self.progress.update(self.put, total, "lost events put")
                if self.stop.is_set():
                    self.interrupted = True
                    return

    def _read_back(self, shard_id: str, positions: Collection[Position]) -> list[SourceRecord]:
        """The lost records as the daemon delivers them (KPL aggregates de-aggregated), in staging order."""
        out: list[SourceRecord] = []
        for page in self.streams.read_source(self.config.stream_name, shard_id, min(positions), max(positions)):
            out.extend(r for r in page if r.position in positions)
        return sorted(out, key=lambda r: r.position)

    def summary(self, final: VerifyResult | None) -> list[str]:
        """What the run found and did, and the audit after it, for stdout."""
        put = [d for d in self.decisions if d.put is not None and d not in self.not_found]
        waiting = [d for d in self.decisions if d.put is None and not d.unverifiable]
        old = [d for d in self.decisions if d.unverifiable]
        verb = "would put" if self.dry_run else "put"
        lines = [
            f"repair: {self.config.stream_name} -> {self.config.target_stream_name}"
            + (" (dry run: nothing written)" if self.dry_run else ""),
            f"  lost in the range: {len(self.decisions)}; {verb} {len(put)}; waiting {len(waiting)}",
        ]
        lines += [f"    {verb}: {d.what()}" for d in put[:EXAMPLES]]
        lines += [f"    waiting: {d.what()}: {d.why}" for d in waiting]
        if old:
            gone = "before the target's retention, or the dead-letter stream's"
            lines.append(f"  unverifiable, not put ({gone}): {len(old)}")
            lines += [f"    unverifiable: {d.what()}" for d in old[:EXAMPLES]]
        lines += [f"    not put (the daemon does not deliver this record): {d.what()}" for d in self.not_found]
        if self.taken_over:
            taken = ", ".join(sorted(set(self.taken_over)))
            lines.append(f"  taken over by another repair (it goes on there): {taken}")
        if self.unknown is not None:
            lines.append(f"  the live copier's committed positions could not be read ({self.unknown}): nothing is put")
        if self.interrupted:
            lines.append("repair: INTERRUPTED: run it again to go on (nothing is put twice)")
        if final is not None:
            lines.append(f"repair: the audit after the repair (lost in the range: {len(self.after)}):")
            lines += ["  " + line for line in render_text(final).splitlines()]
        return lines

    def exit_status(self, final: VerifyResult | None) -> int:
        """0: nothing of the range is lost any more and the audit finds nothing else wrong (copies beyond the
        reports, changed bytes, invalid dead letters); 1 otherwise; 130 interrupted; a dry run 0."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        if self.dry_run:
            return 0
        if final is None or self.after or self.taken_over:
            return 1
        r = final.report
        wrong = r.unexplained_copies + r.changed + r.invalid_dead_letters + r.unkeyed_unexplained + final.undecodable
        return 0 if wrong == 0 else 1


def _trimmed(result: VerifyResult, examples: int) -> VerifyResult:
    """The audit as the report shows it: ``examples`` of each problem (it was made with every one listed)."""
    report = result.report
    cut = {f.name: getattr(report, f.name)[:examples] for f in fields(report) if f.name.endswith("_examples")}
    return replace(result, report=replace(report, **cut))


def _place(text: str) -> tuple[str, int, int]:
    """A staging position as the audit writes it (``shard@sequence/sub-sequence``)."""
    shard, _, rest = text.partition("@")
    seq, _, sub = rest.partition("/")
    try:
        return shard, int(seq), int(sub or 0)
    except ValueError:
        return shard, -1, -1


def closing(put: int, dry_run: bool) -> tuple[int, int | None, str]:
    """The last progress line's arguments: a dry run puts nothing, so it shows no count before saying so."""
    return (0, 0, "dry run: nothing put") if dry_run else (put, None, "lost events put")


def main(args: argparse.Namespace) -> int:
    """``copier repair``; see the module docstring for the exit statuses."""
    from copier.adapters.logs import configure_logging
    from copier.adapters.metrics import emitter_for
    from copier.commands.cli import _processor_clients
    from copier.core.clockcheck import ClockBounds

    config = command_config(args.properties)
    reports = read_reports(args.reports) if args.reports else []
    configure_logging(config.log_level)
    store, streams = _processor_clients(config, ClockBounds())
    progress = RunProgress("repair")
    reading = ReadingProgress(progress)
    stop = threading.Event()
    run = RepairRun(
        config,
        store,
        streams,
        StreamReader(make_client(config), reading),
        StreamReader(make_client(config, True), reading),
        args.since,
        args.until,
        args.dry_run,
        reports,
        args.examples,
        progress,
        stop,
        SourceMetrics(emitter_for(config), "Repair", config.metrics_interval_seconds),
    )
    previous = {sig: signal.signal(sig, stopping(stop)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        final = run.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    progress.finish(*closing(run.put, args.dry_run))
    print("\n".join(run.summary(final)), flush=True)
    return run.exit_status(final)
