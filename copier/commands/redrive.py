"""``copier redrive``: send dead-lettered events on to the target, exactly once, once their cause is fixed.

A copier source like the staging stream (docs/protocol.md, "Redriving the
dead-letter stream"): each dead-letter shard is read from its start (or from
``--since``, less a minute) to its end and forwarded through the per-shard
protocol (``copier.shard.source``) under its own state item,
``redrive:<dead-letter stream>/<shard>``: intent before the put, a chunk in
flight verified after a crash, fencing against a second run on the same
shard. What each record becomes is ``copier.core.redrive``: the original's key
and bytes to the target, or nothing (not selected, sent already, fails
again, not redrivable), never the dead-letter stream: it is left as it is.

``--dry-run`` reads the same records and the shards' windows and says what
would go, by reason, with examples; it writes nothing. Progress goes to
stderr (``copier.adapters.progress``); the summary to stdout. Ctrl-C (or
SIGTERM) stops after the chunk in flight and releases the shards (run it
again to go on); a second Ctrl-C stops at once, and the next run waits out
this one's lease and verifies what it left in flight.

A run takes every dead-letter shard over before it sends anything, and
loads each shard's window (what was sent from every shard of the stream)
just before reading it: two runs never send at once, and a run fenced on one
shard stops there, leaving the rest to the run that fenced it.

Exit status: 0 every selected record is in the target; 1 some could not be
sent (failed again, not redrivable: listed) or a shard was taken over by
another run; 2 bad arguments or properties; 3 a fatal AWS error; 4 a stream
setting under which copier does not forward (the dead-letter stream or the
target ignoring partition keys); 130 interrupted.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from copier.adapters.journal import say
from copier.adapters.localkeys import command_config
from copier.adapters.progress import RunProgress
from copier.adapters.sourcemetrics import SourceMetrics
from copier.adapters.streamreader import KinesisRecord, Progress, StreamReader, make_client
from copier.commands.export import _instant_ms
from copier.core.auditinputs import arrival_ms
from copier.core.audittypes import digest_name
from copier.core.config import Config
from copier.core.envelope import REASON_KINDS, read_envelope_bytes
from copier.core.errors import ConfigError, FatalAwsError, FencedError, TransientAwsError
from copier.core.limits import MAX_RETENTION_MS
from copier.core.packing import unpack_digests
from copier.core.plan import SourceRecord
from copier.core.ports import Streams
from copier.core.positions import Position
from copier.core.redrive import RedriveRule, RedriveTally, Selection, needs_payload
from copier.core.retry import backoff_ms
from copier.core.state import ShardState, StateStore, shard_key
from copier.core.streamsettings import blocking
from copier.shard.source import SourceShard

__all__ = ["PREFIX", "RedriveRun", "add_arguments", "main", "redriven_names", "source_config", "stopping"]

PREFIX = "redrive:"
HOUR_MS = 3_600_000
SINCE_SLACK_MS = 60_000  # a record's dead-letter arrival is after its staging arrival, on Kinesis' clocks
MAX_WINDOW_IDS = 10**12  # the redrive window holds every record sent within the retention: no cap
EXIT_MISSED, EXIT_SETTINGS, EXIT_INTERRUPTED = 1, 4, 130
READ_ATTEMPTS = 10  # reading an envelope's record back from staging, through throttles


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``copier redrive``."""
    parser.add_argument("--properties", required=True, metavar="FILE", help="the copier's properties file")
    when = "epoch ms, ISO 8601, relative (-2h, -30m, -1d) or now"
    parser.add_argument(
        "--since", type=_instant_ms, metavar="TIME", help=f"only events that arrived in staging at or after ({when})"
    )
    parser.add_argument("--until", type=_instant_ms, metavar="TIME", help=f"only events that arrived before ({when})")
    parser.add_argument(
        "--reason",
        action="append",
        choices=sorted(REASON_KINDS),
        help="only records dead-lettered for this reason (no_id: no event ID; oversize: over the target's record "
        "limit; key: a partition key Kinesis refuses); repeat for several (default: every reason)",
    )
    parser.add_argument(
        "--shard", action="append", metavar="SHARD_ID", help="only events from this staging shard; repeat for several"
    )
    parser.add_argument("--dry-run", action="store_true", help="say what would be sent (counts by reason, examples)")


def source_config(config: Config) -> Config:
    """The configuration of a redrive's shard sessions: the dead-letter stream is the stream read (its shards'
    items and lineage), nothing goes back to it, and the window reaches back the longest retention Kinesis allows
    (365 days) plus an hour, uncapped: what was sent is remembered as long as it can be read. Not the stream's
    retention as read now: it may be raised after a run (check-config advises it), Kinesis then keeps the records
    already there the longer time, and digest batches that expired with the old one would let them go again."""
    assert config.dead_letter_stream_name is not None
    horizon_ms = MAX_RETENTION_MS + HOUR_MS
    return replace(
        config,
        stream_name=config.dead_letter_stream_name,
        dead_letter_stream_name=None,
        dedup_window_seconds=horizon_ms // 1000,
        dedup_window_max_events=MAX_WINDOW_IDS,
    )


def source_record(record: KinesisRecord) -> SourceRecord:
    """A dead-letter record as the pipeline takes it (copier writes plain records there: sub-sequence 0)."""
    return SourceRecord(
        Position(int(record["SequenceNumber"])), record["PartitionKey"], bytes(record["Data"]), arrival_ms(record)
    )


@dataclass
class ShardOutcome:
    shard_id: str
    taken_over: bool = False
    committed: Position | None = None


@dataclass
class RedriveRun:
    """One run over the dead-letter stream's shards; :meth:`run` returns the tally."""

    config: Config
    selection: Selection
    store: StateStore
    streams: Streams
    reader: StreamReader
    dry_run: bool = False
    progress: RunProgress | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    make_shard: Callable[..., SourceShard] = SourceShard
    metrics: SourceMetrics | None = None
    rule: RedriveRule = field(init=False)
    shards: list[ShardOutcome] = field(default_factory=list)
    interrupted: bool = False
    fenced: bool = False  # another run took a shard over: this one stops, and leaves the rest to it
    _held: dict[str, SourceShard] = field(default_factory=dict)  # taken over, not read yet
    _told: int = 0  # events sent that the metrics were told of

    def __post_init__(self) -> None:
        self.rule = RedriveRule(self.selection)

    @property
    def tally(self) -> RedriveTally:
        return self.rule.tally

    def blocked(self) -> str | None:
        """Why copier would not forward from the dead-letter stream now (its records scattered over shards
        whose windows do not see each other, an AUTO target under ``ordering = partitionKey``, or a target
        whose settings cannot be read: its record limit decides which dead-lettered records it takes, and a
        run does not guess it, nor try a record a 1 MiB target would refuse for as long as the run lasts)."""
        dlq = self.config.dead_letter_stream_name
        assert dlq is not None
        name = self.config.target_stream_name
        target = self.streams.settings(name)
        if target is None:
            return (
                f"the target stream {name}'s settings cannot be read (DescribeStreamSummary failed: throttled, "
                "the account's 20 calls a second, or denied): its record limit decides which dead-lettered "
                "records it takes. Nothing was sent; run the redrive again"
            )
        return blocking(self.streams.settings(dlq), target, self.config.ordering)

    def run(self) -> RedriveTally:
        """Take every dead-letter shard over, then send from each, parents first; a run fenced anywhere stops
        (another run is taking the stream over, and goes on where this one stopped)."""
        dlq = self.config.dead_letter_stream_name
        assert dlq is not None
        source = source_config(self.config)
        listed = [shard["ShardId"] for shard in self.reader.shards(dlq)]  # parents before their children
        held = self._held = {} if self.dry_run else self._take_all(source, listed)
        for n, shard_id in enumerate(listed):
            if self.stop.is_set():
                self.interrupted = True
                break
            if self.dry_run:
                self._shard(source, shard_id, None, n, len(listed))
            elif shard_id in held and not self.fenced:
                self._shard(source, shard_id, held.pop(shard_id), n, len(listed))
            else:
                self.shards.append(ShardOutcome(shard_id, taken_over=True))
        for shard in held.values():  # not reached (interrupted, fenced elsewhere): between chunks, nothing in flight
            shard.finish()
        self._show(len(self.shards), len(listed), final=True)
        return self.tally

    def _take_all(self, source: Config, listed: list[str]) -> dict[str, SourceShard]:
        """Take every shard's item over (verifying what each has in flight) before anything is sent, stopping at
        the first fence. Two runs then never send at once: a run that takes a shard over fences the other there,
        and sends nothing until it holds every shard, by when the other is fenced wherever it could still send.
        Each window is loaded after that (``SourceShard.load``), so it holds all another run committed."""
        held: dict[str, SourceShard] = {}
        for shard_id in listed:
            if self.stop.is_set():
                break
            shard = self.make_shard(source, self.store, self.streams, PREFIX, self.rule, replanning=False)
            if not shard.take(shard_id):
                self.fenced = True
                break
            held[shard_id] = shard
        return held

    def _keep_held(self) -> None:
        """Between pages, renew the leases of the shards held and not read yet (``copier status`` shows them
        running); a renewal refused is another run taking the stream over: this one goes on to no other shard."""
        for shard in self._held.values():
            try:
                shard.session.keep_lease()
            except FencedError:
                shard.session.fence("keep_lease")
                self.fenced = True

    def _shard(self, source: Config, shard_id: str, held: SourceShard | None, n: int, total: int) -> None:
        outcome = ShardOutcome(shard_id)
        self.shards.append(outcome)
        if held is None:  # a dry run: the item and the window as they are, nothing written
            shard = self.make_shard(source, self.store, self.streams, PREFIX, self.rule, replanning=False)
            state = shard.peek(shard_id)
        else:
            shard = held
            shard.load()
            state = shard.state
        redo = bool(state is not None and state.redo_digests)
        since = self.selection.since_ms
        start = None if redo or since is None else since - SINCE_SLACK_MS
        # Released only between chunks: a run stopped mid-put (a second Ctrl-C, a crash) keeps its lease, so the
        # next run waits it out and verifies the chunk in flight.
        for page in self.reader.pages(source.stream_name, shard_id, since_ms=start):
            records = [source_record(r) for r in page]
            self.rule.payloads = self._payloads(records, redo)
            if self.dry_run:
                self._plan_only(shard, records, state or ShardState())
            else:
                outcome.committed = shard.forward(records) or outcome.committed
                if shard.fenced:
                    outcome.taken_over = self.fenced = True
                    return
                self._keep_held()
            self._show(n, total)
            self._sent(shard_id)
            if self.stop.is_set():
                self.interrupted = True
                break
        if not self.dry_run:
            shard.finish()
            self._sent(shard_id, done=True)

    def _sent(self, shard_id: str, done: bool = False) -> None:
        """Tell the metrics what was sent since the last time (``RedriveInProgress``, ``EventsRedriven``)."""
        if self.metrics is None or self.dry_run:
            return
        total = sum(self.tally.sent.values())
        self.metrics.sent(shard_id, total - self._told, done)
        self._told = total

    def _plan_only(self, shard: SourceShard, records: list[SourceRecord], state: ShardState) -> None:
        """A dry run's chunk: planned as a run would, what it would send remembered for the next chunks."""
        s = shard.session
        plan = self.rule(records, state, s.window, s.settings())
        s.window.add(plan.keyed_digests + plan.dead_ids, plan.arrival_max_ms)

    def _payloads(self, records: list[SourceRecord], redo: bool) -> dict[Position, bytes | None]:
        """The bytes of envelopes that kept only their SHA-256, read back from staging at the position they name
        (None where staging no longer holds them)."""
        out: dict[Position, bytes | None] = {}
        for record in records:
            envelope = read_envelope_bytes(record.data)
            if needs_payload(envelope, self.selection, redo):
                out[record.position] = self._staged(envelope.stream, envelope.shard_id, envelope.position)
        return out

    def _staged(self, stream: str, shard_id: str, position: Position) -> bytes | None:
        """The record at ``position`` of a staging shard (None: staging no longer has it, or it is another
        copier's stream). A throttle or a fault that passes is retried: only a record gone is not redrivable."""
        if stream != self.config.stream_name:
            return None
        for attempt in range(READ_ATTEMPTS):
            try:
                for page in self.streams.read_source(stream, shard_id, position, position):
                    for record in page:
                        if record.position == position:
                            return record.data
                return None
            except TransientAwsError as exc:
                if exc.code == "ShardNotListed":  # expired with the stream's retention
                    return None
                time.sleep(backoff_ms(attempt, self.config.max_backoff_millis) / 1000)
            except FatalAwsError as exc:
                if exc.host_wide:
                    raise
                return None  # the position is past the trim horizon: not redrivable
        raise TransientAwsError("GetRecords", "Throttled", f"staging {shard_id} could not be read at {position}")

    def _show(self, done: int, total: int, final: bool = False) -> None:
        if self.progress is None:
            return
        t = self.tally
        sent = sum(t.sent.values())
        what = (
            f"dead-letter shards; {t.read} records read, {t.selected} selected, "
            f"{sent} {'would go' if self.dry_run else 'sent'}, {len(t.missed)} not sendable"
        )
        (self.progress.finish if final else self.progress.update)(done, total, what)

    def summary(self) -> list[str]:
        """What the run did, for stdout."""
        t = self.tally
        dlq, target = self.config.dead_letter_stream_name, self.config.target_stream_name
        by_reason = ", ".join(f"{kind} {n}" for kind, n in sorted(t.sent.items())) or "none"
        verb = "would send" if self.dry_run else "sent"
        lines = [
            f"redrive: {dlq} -> {target}{' (dry run: nothing written)' if self.dry_run else ''}",
            f"  read {t.read} dead-letter records in {len(self.shards)} shards ({t.not_envelopes} not envelopes); "
            f"selected {t.selected}",
            f"  {verb} {sum(t.sent.values())} ({by_reason}); sent before {t.already}"
            + (f"; resumed from a run killed or fenced mid-put {t.resumed}" if t.resumed else ""),
        ]
        for kind, examples in sorted(t.examples.items()):
            lines += [f"    {kind}: {e}" for e in examples]
        for title, missed in (("failed again", t.failed_again), ("not redrivable", t.not_redrivable)):
            if missed:
                lines.append(f"  {title} {len(missed)} (left in the dead-letter stream):")
                lines += [f"    {m.line()}" for m in missed]
        taken = [o.shard_id for o in self.shards if o.taken_over]
        if taken:
            lines.append(f"  taken over by another redrive (it goes on there): {', '.join(taken)}")
        if self.interrupted:
            lines.append("redrive: INTERRUPTED: run it again to go on (nothing is sent twice)")
        elif t.missed or taken:
            lines.append(
                f"redrive: INCOMPLETE: {len(t.missed)} selected records not sent, {len(taken)} shards taken over"
            )
        else:
            lines.append("redrive: DONE" if not self.dry_run else "redrive: dry run done")
        return lines

    def exit_status(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        if self.tally.missed or any(o.taken_over for o in self.shards):
            return EXIT_MISSED
        return 0


def redriven_names(config: Config, store: StateStore, shard_ids: list[str]) -> set[str]:
    """The digest names of what redrives sent from the dead-letter stream (its committed digest batches: each
    record's own digest, and the event IDs of keyed ones), for the audit: a dead-letter record a redrive sent is
    no copy of its own; the target's is (``copier.core.audit``)."""
    dlq = config.dead_letter_stream_name
    if not dlq:
        return set()
    names: set[str] = set()
    keys = [PREFIX + shard_key(dlq, s) for s in shard_ids]
    for key, state in store.get_many(keys).items():
        for batch in store.batches(key, state.batches):
            names.update(digest_name(d) for d in unpack_digests(batch.keyed) + unpack_digests(batch.dead_ids))
    return names


def stopping(stop: threading.Event) -> Callable[[int, Any], None]:
    """A SIGINT/SIGTERM handler for a long run: the first asks it to stop after the chunk in flight, a second
    stops it at once (KeyboardInterrupt: the lease is kept, the next run verifies what is in flight)."""

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        say("stopping after the chunk in flight (again to stop at once); run it again to go on", "warning")

    return handler


def main(args: argparse.Namespace) -> int:
    """``copier redrive``; see the module docstring for the exit statuses."""
    from copier.adapters.logs import configure_logging
    from copier.adapters.metrics import emitter_for
    from copier.commands.cli import _processor_clients
    from copier.core.clockcheck import ClockBounds

    config = command_config(args.properties)
    if not config.dead_letter_stream_name:
        raise ConfigError(
            config.path, "copier.deadLetterStreamName", "not set: there is no dead-letter stream to redrive"
        )
    selection = Selection(args.since, args.until, frozenset(args.reason or ()), frozenset(args.shard or ()))
    configure_logging(config.log_level)
    store, streams = _processor_clients(config, ClockBounds())
    progress = RunProgress("redrive")
    reader = StreamReader(make_client(config, True), Progress())
    stop = threading.Event()
    metrics = SourceMetrics(emitter_for(config), "Redrive", config.metrics_interval_seconds)
    run = RedriveRun(config, selection, store, streams, reader, args.dry_run, progress, stop, metrics=metrics)
    problem = run.blocked()
    if problem is not None:
        say(f"error: {problem}", "error")
        return EXIT_SETTINGS
    previous = {sig: signal.signal(sig, stopping(stop)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        run.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("\n".join(run.summary()), flush=True)
    return run.exit_status()
