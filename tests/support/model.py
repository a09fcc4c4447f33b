"""The exactly-once model's world: a daemon delivering one staging shard to successive processors under drawn faults.

``tests/test_exactly_once_model.py`` draws, with Hypothesis, everything this
driver does; the driver plays the KCL's part (batches from the last
checkpoint, a new processor after a crash, a lease race) and the world's
(an operator restarting a stalled shard with a new configuration, outages,
target reshards, another staging shard's identical records). What each
fault stands for:

* ``throttle``, ``ambiguous``, ``crash_mid_put``, ``crash_store``: the put's
  entries land per a drawn mask; the request fails, its outcome is unknown,
  or the process dies mid-put or just before or after a state write;
* ``pause``: a writer frozen before its digest batch write while a successor
  takes over; the write lands at a drawn later moment (a zombie's leftover);
* ``race``: a rival takes copier's lease (and may forward from the
  checkpoint), then loses the daemon's lease, while the first processor keeps
  receiving batches, fenced, holding at most a drawn number of records; or
  the first is told its lease moved while the rival waits, after a delivery
  whose commit the rival's announcement refused (its chunk left in flight,
  its put ambiguous, throttled or clean): it cuts copier's lease short;
* ``reshard_put``: an ambiguous put during which the target is split or
  merged, and the processor's cached shard map refreshed at once;
* ``auto_put``: the target ignores partition keys (RecordDistributionStrategy
  AUTO) for one put, switched on and back around it (the processor's last
  look said USER_PARTITION_KEY): the entries land on any shard, and the answer is
  lost, or the process dies mid-put;
* ``outage``: the process dies mid-put and no processor runs for a drawn
  time: seconds, past the digest TTL, past the target's retention, past the
  staging stream's retention;
* ``slow_verify``: the process dies mid-put; its successor's verification
  reads one record a page at half a lease a page, and a rival takes the
  shard over in the middle of it (then loses the daemon's lease);
* ``staging_auto``: the staging stream ignores partition keys for a while
  (AUTO; switched back at once, after seconds, or after a minute): the
  copies of one coming event land on this shard although their key belongs
  to the other staging shard, whose processor forwards its own copy. The
  model lays the staging stream out so that only that key falls outside this
  shard's range; this shard's processor must report what it forwards of it.
* ``other_copy``: another staging shard forwards a record identical to one
  of this shard's unkeyed records.
* ``late_write``: a state write or a digest batch write gets no answer and
  is retried; its first attempt lands at a drawn later round (refused by
  its condition, or applied);
* ``internal_failure``: the first request's entries are answered each as
  drawn: landed, throttled, or ``InternalFailure`` written or not;
* ``limit_lowered``: the target's record limit (raised to 2 MiB when the run
  starts, a drawn choice) is lowered to 1 MiB right after a chunk's digest
  batch is written, before its put: the records over it are refused. Raised
  again never, as soon as a request is refused (before the limits are read
  again), or at the next delivery; and the process dies before or after the
  re-plan's write, mid dead-letter put, or before the commit, as drawn.

Every new processor may run on a host whose clock is off AWS time (which
Kinesis stamps arrivals with): within half of ``copier.clockSkewMillis``
and unmeasured, as the protocol assumes, or many times the margin off and
measured from the Date headers of AWS answers (``copier.core.clockcheck``, fed
by every answer of the fake store and streams), or stepping by several times
the margin, forward or back, between two rounds or while any of its next
AWS calls is in flight (between reading a chunk's start and recording it,
during an ambiguous put): the host learns of a step only from the answers
that follow it.

Every new processor may run with another configuration (a rolling deploy):
the dedup key, the unkeyed policy, the dead-letter stream and the ordering
are drawn. A request AWS keeps rejecting (a record too large, an invalid
partition key) stalls the shard; the operator then restarts it with a
dead-letter stream configured (docs/operations.md, "Stalled shard").
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import event
from hypothesis import strategies as st

import copier.shard.holding
from copier.core.config import Config
from copier.core.errors import AmbiguousPutError
from copier.core.limits import MAX_RECORD_BYTES, record_size
from copier.core.plan import SourceRecord
from copier.core.positions import Position
from copier.core.shardmap import hash_key
from copier.shard import ShardWorker
from tests.support.fakes import (
    SHARD,
    OffsetClock,
    SimulatedCrash,
    SimulatedPause,
    SimulatedStall,
    World,
    config,
    measured,
    once_asleep,
)

MINUTE = 60_000
HOUR = 60 * MINUTE
WINDOW_S = 60  # copier.dedupWindowSeconds in the model
TTL_HOURS = 1  # copier.digestTtlHours in the model
STAGING_RETENTION = 3 * HOUR
TARGET_RETENTION = 90 * MINUTE
OUTAGES = [0, 30_000, 70 * MINUTE, 100 * MINUTE, 4 * HOUR]  # none, short, past the TTL, the target's, staging's
BIG = 1024 * 1024 + 10  # a payload over Kinesis' 1 MiB record limit
RAISED = 2 * MAX_RECORD_BYTES  # a target's record limit raised with UpdateMaxRecordSize
CRASHES_AROUND_A_REPLAN = [
    "none",
    "before the re-plan's write",
    "after the re-plan's write",
    "mid dead-letter put",
    "before the commit",
]
CORE_FAULTS = ["none", "none", "throttle", "ambiguous", "crash_mid_put", "crash_store", "pause", "race"]
NEW_FAULTS = [
    "reshard_put",
    "auto_put",
    "staging_auto",
    "outage",
    "slow_verify",
    "other_copy",
    "late_write",
    "internal_failure",
    "limit_lowered",
]  # other_copy: drawn each round, beside the fault


def keyed_event(
    seq: int, event_id: str, arrival_ms: int, body: str = "x", pk: str | None = None, size: int = 0
) -> SourceRecord:
    """A keyed event: ``eventId`` and an ``id`` in one-to-one correspondence, so both dedup keys name it."""
    payload: dict[str, str] = {"eventId": event_id, "id": f"i-{event_id}", "body": body}
    if size:
        payload["pad"] = "p" * size
    return SourceRecord(Position(seq), event_id if pk is None else pk, json.dumps(payload).encode(), arrival_ms)


def unkeyed(seq: int, content: str, arrival_ms: int, pk: str = "same") -> SourceRecord:
    """A record without an event ID (not JSON): identical contents cannot be told apart."""
    return SourceRecord(Position(seq), pk, content.encode(), arrival_ms)


def event_id_of(data: bytes) -> str | None:
    """The model's own reading of an event ID: a JSON object's ``eventId`` (the producer's truth)."""
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value.get("eventId") if isinstance(value, dict) else None


def original_of(envelope: bytes) -> bytes | None:
    """The original bytes a dead-letter envelope carries (None when it kept only their SHA-256)."""
    body = json.loads(envelope)
    return None if body.get("data") is None else base64.b64decode(body["data"])


@dataclass
class Outcome:
    """What a run did, for the checks: the world, the records never delivered, what copier reported."""

    world: World
    skipped: set[Position] = field(default_factory=set)  # expired from staging before a delivery
    reported: Counter[str] = field(default_factory=Counter)  # event IDs named by possible_duplicates
    reported_unkeyed: Counter[str] = field(default_factory=Counter)  # content digests of records without an ID
    others: Counter[bytes] = field(default_factory=Counter)  # identical copies other shards put
    strays: int = 0  # events whose copies landed here under AUTO (their key's shard forwarded a copy too)
    stalls_with_dlq: int = 0
    trace: str = ""  # the protocol's log events, for a failing example's message

    def copies(self) -> Counter[bytes]:
        """Every record's bytes as delivered: target records, and the originals inside dead-letter envelopes."""
        found = Counter(self.world.streams.data("target"))
        for envelope in self.world.streams.data("dlq"):
            original = original_of(envelope)
            found[original if original is not None else envelope] += 1
        return found


def variants(data: st.DataObject, change_config: bool, ordering: str | None) -> Callable[[bool], Config]:
    """Draws the configuration of each new processor; ``dlq=True`` forces a dead-letter stream (the runbook)."""
    coalescing = data.draw(st.booleans(), label="small deliveries wait")
    daemon = {"callProcessRecordsEvenForEmptyRecordList": "true"} if coalescing else {}
    base: dict[str, object] = {
        "coalesceEvents": data.draw(st.integers(2, 6), label="coalesce events"),
        "coalesceMillis": 300,
        "dedupWindowSeconds": WINDOW_S,
        "digestTtlHours": TTL_HOURS,
    }

    def draw(dlq: bool) -> Config:
        keys = dict(base)
        if change_config:
            keys["dedupKey"] = data.draw(st.sampled_from(["json:eventId", "json:id"]), label="dedup key")
            with_dlq = dlq or data.draw(st.booleans(), label="dead-letter stream")
            if with_dlq:
                keys["deadLetterStreamName"] = "dlq"
                keys["unkeyedPolicy"] = data.draw(st.sampled_from(["forward", "deadletter"]), label="unkeyed policy")
            keys["ordering"] = ordering or data.draw(st.sampled_from(["partitionKey", "none"]), label="ordering")
        elif dlq:
            keys["deadLetterStreamName"] = "dlq"
        return config(daemon, **keys)

    return draw


class Driver:
    """Plays the daemon and the world around one staging shard; see the module docstring."""

    def __init__(
        self,
        data: st.DataObject,
        records: list[SourceRecord],
        *,
        new_faults: bool | list[str] = True,
        change_config: bool = True,
        ordering: str | None = None,
        target_shards: int = 1,
    ) -> None:
        self.data = data
        self.records = records
        self.draw_config = variants(data, change_config, ordering)
        self.config = self.draw_config(False)
        self.world = World(
            self.config,
            chunk_events=data.draw(st.integers(1, 4), label="chunk size"),
            target_shards=target_shards,
            ttl_ms=TTL_HOURS * HOUR,
            retention_ms={"staging": STAGING_RETENTION, "target": TARGET_RETENTION, "dlq": TARGET_RETENTION},
            stall_after=2,
        )
        self.outcome = Outcome(self.world)
        chosen = NEW_FAULTS if new_faults is True else (new_faults or [])
        self.faults = CORE_FAULTS + [f for f in chosen if f in NEW_FAULTS and f != "other_copy"]
        self.other_copies = new_faults is True or "other_copy" in chosen
        self.held_caps = [200_000, 3] if new_faults is True or "held_cap" in chosen else [200_000]
        skewed = new_faults is True or "clocks" in chosen
        self.clock_kinds = ["exact", "exact", "within", "beyond", "stepping"] if skewed else ["exact"]
        streams = self.world.streams
        streams.add_staging(SHARD, records)
        self.stray_key = ""
        self.strays: set[str] = set()  # events whose copies landed here under AUTO (the other shard forwarded one)
        if "staging_auto" in self.faults:
            self.stray_key = stray_key(records)
            streams.set_ranges("staging", [0, hash_key(self.stray_key)])  # this shard holds every key but it
        if "reshard_put" in self.faults:
            streams.map_max_age_ms = data.draw(st.sampled_from([None, 5_000, 300_000]), label="shard map max age")
        if (
            "limit_raised" not in chosen
            and "limit_lowered" in self.faults
            and data.draw(st.booleans(), label="target's record limit raised")
        ):
            streams.max_record_bytes["target"] = RAISED
        elif "limit_raised" in chosen:
            streams.max_record_bytes["target"] = RAISED
        self.raise_limit = False  # the target's lowered limit is raised again at the next delivery
        if "staging_auto" in self.faults or "auto_put" in self.faults:
            # DescribeStreamSummary's answers as old as the adapter keeps them: a switch seen minutes late
            streams.cache_settings = data.draw(st.booleans(), label="stream settings cached as the adapter does")
        self.world.clock.now = min((r.arrival_ms for r in records), default=self.world.clock.now)
        self.dlq_next = False  # the next processor gets a dead-letter stream (after a stall)
        self.checkpoint = 0  # records up to the last checkpoint
        self.position = 0  # next record the daemon delivers
        self.delivered = 0  # records up to here were delivered at least once

    # -- processors ---------------------------------------------------------------------------------

    def new_worker(self, cfg: Config | None = None) -> ShardWorker:
        """A new processor takes the shard over, with a freshly drawn configuration, on a host whose clock may
        be off AWS time: within half of ``copier.clockSkewMillis`` unmeasured (the protocol's assumption), or
        several times the margin off and measured from AWS answers (``copier.core.clockcheck``)."""
        if cfg is None:
            cfg = self.draw_config(self.dlq_next)
        skew = cfg.clock_skew_millis
        kind = self.data.draw(st.sampled_from(self.clock_kinds), label="host clock")
        if kind == "within":
            offset = self.data.draw(st.integers(-skew // 2, skew // 2), label="clock offset ms")
            return self.world.worker(SHARD, cfg, OffsetClock(self.world.clock, offset))
        if kind in ("beyond", "stepping"):
            offset = 0
            if kind == "beyond":
                offset = self.data.draw(st.sampled_from([-3 * skew, 3 * skew, 20 * skew]), label="clock offset ms")
            host = OffsetClock(self.world.clock, offset)
            bounds = measured(host)  # what the host learnt before, then every answer
            return self.world.worker(SHARD, cfg, host, bounds, answering=True)
        return self.world.worker(SHARD, cfg)

    def step_clock(self, worker: ShardWorker) -> None:
        """The processor's host clock jumps (forward or back, by several times the margin) while it runs:
        it learns of it only from the Date of the AWS answers that follow."""
        if isinstance(worker.clock, OffsetClock) and worker.clock_bounds is not None:
            skew = worker.config.clock_skew_millis
            step = self.data.draw(st.sampled_from([-20 * skew, -3 * skew, 3 * skew, 20 * skew]), label="clock step ms")
            during = self.data.draw(st.integers(0, 6), label="step during the n-th AWS call from now (0: now)")
            if during:
                worker.clock.step_during_call(during, step)
            else:
                worker.clock.offset_ms += step

    def restart(self, slow_verification: bool = False) -> ShardWorker:
        """After a crash: a new processor, and the daemon replays from its checkpoint."""
        self.reset_faults()
        if slow_verification:
            self.arm_slow_verification()
        self.position = self.checkpoint
        while True:
            try:
                return self.new_worker()
            except SimulatedStall:
                continue  # no: a takeover puts nothing

    def reset_faults(self) -> None:
        world = self.world
        world.store.crash_hook = lambda p, c: False
        world.store.hold_next = False
        world.store.lose_next_answer = False
        world.store.lose_next_batch_answer = False
        world.streams.fault = lambda s, e: ([True] * len(e), None)
        world.streams.read_page = 0
        world.streams.page_ms = 0
        world.streams.on_read_page = None
        world.streams.on_refused = None

    # -- deliveries ---------------------------------------------------------------------------------

    def next_batch(self, size: int) -> list[SourceRecord]:
        """The next ``size`` records, as the daemon reads them now: expired ones are gone (and noted)."""
        batch: list[SourceRecord] = []
        while self.position < len(self.records) and len(batch) < size:
            record = self.records[self.position]
            self.position += 1
            batch.extend(self.readable([record]))
        self.delivered = max(self.delivered, self.position)
        if batch:  # a record is read after it arrived
            self.world.clock.now = max(self.world.clock.now, max(r.arrival_ms for r in batch))
        return batch

    def readable(self, records: list[SourceRecord]) -> list[SourceRecord]:
        """Those of ``records`` the staging stream still holds now; the expired ones are noted as skipped
        (Kinesis trims them: no processor, the rival's included, is ever delivered them)."""
        oldest = self.world.clock.now_ms() - STAGING_RETENTION
        kept = []
        for record in records:
            if record.arrival_ms < oldest or record.position in self.outcome.skipped:
                self.outcome.skipped.add(record.position)
            else:
                kept.append(record)
        return kept

    # -- the run --------------------------------------------------------------------------------------

    def run(self) -> Outcome:
        data, world = self.data, self.world
        worker = self.restart()
        fault_budget = 8
        wake_in = -1  # rounds until a frozen writer's held write lands
        while self.position < len(self.records) or world.store.held:
            if wake_in == 0 or (world.store.held and self.position >= len(self.records)):
                world.store.release_held()
                if data.draw(st.booleans(), label="lease moves after the zombie's write"):
                    worker.release()
                    worker = self.restart()
            wake_in -= 1
            late = world.store.late or world.store.late_batches
            if late and data.draw(st.booleans(), label="an owner write's first attempt lands now"):
                world.store.land_late()
            if self.position >= len(self.records):
                break
            if world.streams.map_max_age_ms is not None and data.draw(st.booleans(), label="shard map refreshed"):
                world.streams.refresh_map("target")
            idle = data.draw(st.booleans(), label="an empty call of an idle shard")
            world.clock.advance(data.draw(st.sampled_from([0, 0, 100, 400]), label="ms since the last call"))
            fault = data.draw(st.sampled_from(self.faults), label="fault") if fault_budget > 0 else "none"
            if fault != "none":
                fault_budget -= 1
            if fault == "race":
                worker = self.race(worker)
                fault = "none"
            if fault == "staging_auto":
                self.staging_auto()
                fault = "none"
            if self.other_copies and data.draw(st.booleans(), label="another shard's identical copy"):
                self.other_copy()
            if "stepping" in self.clock_kinds and data.draw(st.integers(0, 5), label="clock steps") == 3:
                self.step_clock(worker)
            batch = [] if idle else self.next_batch(data.draw(st.integers(1, 8), label="batch size"))
            self.arm(fault, len(batch))
            try:
                committed = worker.process(batch)
            except SimulatedStall:
                self.outcome.stalls_with_dlq += worker.config.dead_letter_stream_name is not None
                self.dlq_next = True  # the runbook: configure a dead-letter stream and restart
                worker = self.restart()
                continue
            except (SimulatedCrash, SimulatedPause) as stopped:
                if isinstance(stopped, SimulatedPause):  # frozen past its lease: a successor takes over
                    world.clock.advance(worker.config.lease_millis + worker.config.clock_skew_millis + 1)
                    wake_in = data.draw(st.integers(0, 3), label="frozen for rounds")
                if fault == "outage":
                    world.clock.advance(data.draw(st.sampled_from(OUTAGES), label="outage ms"))
                worker = self.restart(slow_verification=fault == "slow_verify")
                self.reset_faults()
                continue
            finally:
                self.reset_faults()
            if committed is not None and data.draw(st.booleans(), label="checkpointed"):
                self.checkpoint = self.position
        # The shard ends: the daemon asks its last processor once. A fenced one waits out the rival's lease (on
        # the fake clock), takes the shard back and forwards what it holds before it answers.
        while True:
            try:
                assert worker.end_shard(), "the last processor closes the shard"
                break
            except SimulatedStall:
                self.dlq_next = True
                worker = self.restart()
                while self.position < len(self.records):
                    worker.process(self.next_batch(8))
        return self.outcome

    def arm(self, fault: str, size: int) -> None:
        """Set the drawn fault up for the next delivery's puts and writes."""
        data, world = self.data, self.world
        if self.raise_limit:
            self.raise_limit = False
            world.streams.max_record_bytes["target"] = RAISED
        mask = data.draw(st.lists(st.booleans(), min_size=size, max_size=size), label="landed mask")
        codes = ["ok", "throttled", "internal failure, written", "internal failure, not written"]
        answers = data.draw(st.lists(st.sampled_from(codes), min_size=size, max_size=size), label="entry answers")
        latency = data.draw(st.sampled_from([0, 0, 700, 2600]), label="put latency ms")
        calls = {"n": 0}
        reshard = self.reshard if fault == "reshard_put" else None
        dies = fault == "auto_put" and data.draw(st.booleans(), label="dies mid-put (else the answer is lost)")

        def put_fault(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
            calls["n"] += 1
            first = calls["n"] == 1
            world.clock.advance(latency)  # records land this long after the chunk started
            land = (mask + [True] * len(entries))[: len(entries)]
            if not first:
                return [True] * len(entries), None
            if fault == "throttle":
                return land, None
            if fault == "internal_failure":
                outcome = {"ok": True, "throttled": False}
                outcome |= {"internal failure, written": (True, "InternalFailure")}
                outcome |= {"internal failure, not written": (False, "InternalFailure")}
                return [outcome[a] for a in (answers + ["ok"] * len(entries))[: len(entries)]], None
            if fault == "ambiguous":
                return land, AmbiguousPutError("PutRecords", "ReadTimeoutError", "injected")
            if fault in ("crash_mid_put", "outage", "slow_verify"):
                return land, SimulatedCrash("mid put")
            if fault == "auto_put" and stream == "target":
                world.streams.auto.add("target")  # for this put only: switched back once its entries landed
                world.streams.after_put = lambda: world.streams.auto.discard("target")
                return land, AmbiguousPutError("PutRecords", "ReadTimeoutError", "injected") if dies is False else (
                    SimulatedCrash("mid put")
                )
            if reshard is not None and stream == "target":
                world.streams.after_put = reshard  # the target reshards once these entries landed
                return land, AmbiguousPutError("PutRecords", "ReadTimeoutError", "injected")
            return [True] * len(entries), None

        world.streams.fault = put_fault
        phase = data.draw(st.sampled_from(["before", "after"]), label="crash phase")
        call = data.draw(st.sampled_from(["put_batch", "write"]), label="crash at")
        world.store.crash_hook = lambda p, c: fault == "crash_store" and p == phase and c == call
        world.store.hold_next = fault == "pause" and not world.store.held
        lost = data.draw(st.sampled_from(["state", "digest batch"]), label="write whose answer is lost")
        world.store.lose_next_answer = fault == "late_write" and lost == "state"
        world.store.lose_next_batch_answer = fault == "late_write" and lost == "digest batch"
        if fault == "limit_lowered":
            self.lower_limit()

    def lower_limit(self) -> None:
        """The target's record limit is lowered to 1 MiB once the next chunk's digest batch is written; raised
        again as drawn; the process dies around the re-plan as drawn."""
        data, world = self.data, self.world
        again = data.draw(st.sampled_from(["never", "when refused", "next delivery"]), label="limit raised again")
        crash = data.draw(st.sampled_from(CRASHES_AROUND_A_REPLAN), label="crash around the re-plan")
        writes = [0]

        def hook(phase: str, call: str) -> bool:
            if call == "put_batch" and phase == "after":
                writes[0] += 1
                if writes[0] == 1:
                    world.streams.max_record_bytes["target"] = MAX_RECORD_BYTES
                    event("record limit lowered while a chunk is in flight")
            if call == "put_batch" and writes[0] >= 1 and crash == "before the re-plan's write":
                return phase == "before"
            if call == "put_batch" and writes[0] >= 2 and crash == "after the re-plan's write":
                return phase == "after"
            return call == "write" and phase == "before" and writes[0] >= 1 and crash == "before the commit"

        world.store.crash_hook = hook

        def refused() -> None:
            event(f"a request refused over the lowered limit (crash: {crash}; raised again: {again})")
            if again == "when refused":
                world.streams.max_record_bytes["target"] = RAISED

        world.streams.on_refused = refused
        self.raise_limit = again == "next delivery"
        if crash == "mid dead-letter put":
            land = data.draw(st.booleans(), label="the dead-letter put lands")
            world.streams.fault = lambda s, e: (
                [land or s != "dlq"] * len(e),
                SimulatedCrash("mid put") if s == "dlq" else None,
            )

    def reshard(self) -> None:
        """Split or merge the target now, and let the processor's shard map see it at once."""
        streams = self.world.streams
        pairs = streams.adjacent_open_pairs("target")
        if pairs and self.data.draw(st.booleans(), label="merge rather than split"):
            streams.merge("target", *self.data.draw(st.sampled_from(pairs), label="shards merged"))
        else:
            opened = [r[2] for r in streams.current_map("target").ranges]
            streams.split("target", self.data.draw(st.sampled_from(opened), label="shard split"))
        streams.refresh_map("target")

    def race(self, worker: ShardWorker) -> ShardWorker:
        """A rival takes copier's lease, forwards a few batches from the checkpoint, then loses the daemon's lease
        (and releases copier's). The owner may be told that its lease moved (lease_lost: it releases copier's
        lease, under the rival's announcement if the rival waits by then); then the daemon's next processor
        carries on from the checkpoint. Else the owner goes on, fenced, and takes the shard back. The processor
        that carries on is returned."""
        data = self.data
        held_cap = data.draw(st.sampled_from(self.held_caps), label="records a fenced one holds")
        copier.shard.holding.MAX_HELD_RECORDS = held_cap
        told = data.draw(
            st.sampled_from(["no", "while the rival waits", "fenced, then told while the rival waits", "after"]),
            label="owner told lease_lost",
        )
        if told != "no" and told != "after":
            fenced_first = told.startswith("fenced")

            def owner_told() -> bool:
                if fenced_first:
                    self.fenced_delivery(worker)
                return worker.lose_lease()

            with once_asleep(self.world.clock, owner_told) as done:
                rival = self.new_worker()
            if not done:  # the rival did not wait: the owner is told now
                told = "after"
        else:
            rival = self.new_worker()
        if told == "after":
            worker.lose_lease()
        replay = self.checkpoint
        for _ in range(data.draw(st.integers(0, 2), label="batches the rival forwards")):
            size = data.draw(st.integers(1, 6), label="rival batch size")
            batch = self.readable(self.records[replay : replay + size])
            try:
                done = rival.process(batch) if batch else None
            except SimulatedStall:
                break
            if done is not None and data.draw(st.booleans(), label="rival checkpointed"):
                self.checkpoint = replay + size
            replay += size
            self.delivered = max(self.delivered, replay)
        rival.lose_lease()
        if data.draw(st.booleans(), label="time passes before the next batch"):
            self.world.clock.advance(self.config.lease_millis + self.config.clock_skew_millis)
        return worker if told == "no" else self.restart()

    def fenced_delivery(self, worker: ShardWorker) -> None:
        """The daemon delivers to the owner after a rival announced itself: it puts (under a drawn put fault)
        and its commit is refused, leaving the chunk in flight; then it is told its lease moved."""
        batch = self.next_batch(self.data.draw(st.integers(1, 6), label="batch delivered while announced"))
        self.arm(self.data.draw(st.sampled_from(["none", "ambiguous", "throttle"]), label="its put fault"), len(batch))
        try:
            worker.process(batch)
        except SimulatedStall:
            pass  # AWS keeps rejecting a record: the shard stalls, this processor is told all the same
        finally:
            self.reset_faults()

    def arm_slow_verification(self) -> None:
        """The successor's verification reads slowly, and a rival takes the shard over in the middle of it."""
        streams = self.world.streams
        streams.read_page = 1
        streams.page_ms = self.config.lease_millis // 2
        fired = {"done": False}

        def rival_takes_over() -> None:
            if fired["done"]:
                return
            fired["done"] = True
            streams.on_read_page = None
            streams.read_page = 0
            rival = self.new_worker()
            rival.lose_lease()

        streams.on_read_page = rival_takes_over

    def staging_auto(self) -> None:
        """The staging stream ignores keys for a drawn while: a coming event's copies land here under a key
        the other staging shard holds, and that shard's processor forwards its own copy to the target."""
        delivered = {event_id_of(r.data) for r in self.records[: self.delivered]}
        fits = {event_id_of(r.data) for r in self.records if record_size(self.stray_key, r.data) <= MAX_RECORD_BYTES}
        later = {event_id_of(r.data) for r in self.records[self.delivered :]} - delivered - self.strays
        coming = sorted(e for e in later if e is not None and e in fits)
        if not coming:
            return
        chosen = self.data.draw(st.sampled_from(coming), label="event whose copies land here under AUTO")
        for i, record in enumerate(self.records):
            if event_id_of(record.data) == chosen:
                self.records[i] = record._replace(partition_key=self.stray_key)
        streams = self.world.streams
        streams.set_staging(SHARD, self.records)
        first = next(
            r
            for r in self.records
            if event_id_of(r.data) == chosen and record_size(r.partition_key, r.data) <= MAX_RECORD_BYTES
        )
        streams.put_records("target", [(self.stray_key, first.data, None)])  # the other shard's processor
        streams.auto.add("staging")
        back = self.data.draw(st.sampled_from([0, 5_000, MINUTE]), label="staging AUTO for ms")
        streams.auto_until["staging"] = self.world.clock.now_ms() + back
        self.strays.add(chosen)
        self.outcome.strays += 1

    def other_copy(self) -> None:
        """Another staging shard forwards a record identical to one of this shard's coming unkeyed records."""
        coming = [r for r in self.records[self.position :] if event_id_of(r.data) is None]
        if not coming:
            return
        record = self.data.draw(st.sampled_from(coming), label="copied record")
        self.world.streams.put_records("target", [(record.partition_key, record.data, None)])
        self.outcome.others[record.data] += 1


def stray_key(records: list[SourceRecord]) -> str:
    """A partition key that hashes above every key of ``records``: a shard ending below it holds all of them."""
    top = max((hash_key(r.partition_key) for r in records), default=0)
    return next(k for n in range(1_000_000) if hash_key(k := f"stray-{n}") > top)


def collect_reports(logs: list[dict[str, Any]]) -> Counter[str]:
    """Event IDs the copier named in ``possible_duplicates`` (one extra copy each, per report).

    Copier names an event by its ID under the dedup key in force; under
    ``json:id`` that is ``i-<eventId>`` (see :func:`event`).
    """
    named: Counter[str] = Counter()
    for entry in logs:
        if entry["event"] == "possible_duplicates":
            named.update(str(i).removeprefix("i-") for i in entry.get("event_ids", []))
    return named


def collect_unkeyed(logs: list[dict[str, Any]]) -> Counter[str]:
    """Records without an event ID the copier named in ``possible_duplicates`` (by their content digest as put:
    one extra copy each name, per report)."""
    named: Counter[str] = Counter()
    for entry in logs:
        if entry["event"] == "possible_duplicates":
            named.update(str(n) for n in entry.get("unkeyed_digests", []))
    return named


def guaranteed(records: list[SourceRecord]) -> set[str]:
    """Event IDs whose copies all lie within the dedup window of the first: exactly once is promised.

    The window remembers an ID for at least ``dedupWindowSeconds`` of arrival
    time behind the arrival of the record being planned (a later record of
    the same chunk does not shorten it); a later copy may be forwarded again.
    """
    arrivals: dict[str, list[int]] = {}
    for record in records:
        event_id = event_id_of(record.data)
        if event_id is not None:
            arrivals.setdefault(event_id, []).append(record.arrival_ms)
    return {e for e, times in arrivals.items() if max(times) - min(times) <= WINDOW_S * 1000}
