"""One chaos seed: the real pipeline on the local backend, under the faults its plan draws, then the check.

The harness (``copier.chaos.harness``) sets the pipeline up and carries out
the plan's actions (signals to processors, daemons and workers; workers
joining and leaving; staging and target reshards; clock steps of a host)
and opens the proxy's fault windows; this module is the driving loop, which
tells it when, and fills the seed's result (``copier.chaos.result``).

The plan's clock starts once every staging shard has a processor (the KCL
takes 5 to 30 s to hand out its first leases), so that the producer and the
faults meet a copier that is forwarding. After the producer is done and the
last action ran, every staging shard
must commit up to the last record written to it within the plan's catch-up
time: a shard that does not is reported as stalled, and fails the seed.
Then the workers are stopped with SIGTERM, and ``copier.chaos.check`` judges
the streams and logs.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path
from typing import Any

from copier.chaos.check import check, copier_events
from copier.chaos.harness import Harness, put_timeout_ms
from copier.chaos.proxy import FaultWindow, Injection
from copier.chaos.result import SeedResult
from copier.chaos.schedule import Plan, on_backend
from copier.core.audittypes import show
from copier.core.identity import EventValue
from copier.local.independent import Endpoints

__all__ = ["SeedResult", "run_seed"]

RETRIES = 15  # an action that finds no worker with processors is tried again every 2 s, this many times
# A clock step waits longer for processors to live through it (the copier can be idle for 100 s: a killed KCL
# leader's lock expiring); then it steps a host whose processors start on the stepped clock.
STEP_RETRIES = 60
CRASH_LOOP = 3  # unexpected daemon exits in one seed that count as a crash loop
# How long after an ambiguous put the copier reads the target to verify it: a timed-out put waits out its timeout,
# then the put timeout again (copier.shard.forward); a dropped answer comes at once, then the put timeout.
AMBIGUOUS_KINDS = ("put_timeout", "put_lost_response")


def verified_after_s(kind: str, backend: str) -> float:
    """How long after an ambiguous put of ``kind`` its verification reads the target on ``backend``."""
    timeout_s = put_timeout_ms(backend) / 1000
    return 2 * timeout_s if kind == "put_timeout" else timeout_s


def _across_ambiguous_puts(
    reshards: list[dict[str, Any]], injections: list[Injection], target: str, backend: str
) -> None:
    """Mark each target reshard that came between an ambiguous target put and the read that verifies it
    (``across_ambiguous_put``: the kind, and how long before the reshard that put was sent)."""
    for reshard in reshards:
        across = [
            i
            for i in injections
            if i.stream == target
            and i.kind in AMBIGUOUS_KINDS
            and i.at <= reshard["started"]
            and reshard["ended"] < i.at + verified_after_s(i.kind, backend)
        ]
        latest = max(across, key=lambda i: i.at) if across else None
        reshard["across_ambiguous_put"] = latest.kind if latest else None
        reshard["put_before_s"] = round(reshard["started"] - latest.at, 2) if latest else None


def run_seed(plan: Plan, backend: str | Endpoints, workdir: Path) -> SeedResult:
    """Run one seed on the local backend (moto's URL, or a backend's :class:`Endpoints`) without what it cannot
    serve (:func:`copier.chaos.schedule.on_backend`); its logs stay in ``workdir``."""
    started = time.monotonic()
    backend = Endpoints(backend, backend, impl="moto") if isinstance(backend, str) else backend
    plan = on_backend(plan, backend.impl)
    result = SeedResult(plan.seed, plan.profile, plan.kcl_mode, plan.workers, workdir=str(workdir))
    result.backend = backend.impl
    harness = Harness(plan, backend, workdir)
    try:
        _drive(plan, harness, result)
    finally:
        harness.close()
    out = harness.producer.out
    result.events, result.events_written, result.staging_records = len(out.keyed_ids), out.events, out.staging_records
    result.aggregates, result.largest_aggregate = out.aggregates, out.largest_aggregate
    result.producer_duplicates = out.duplicates
    result.poison = len(out.poison)
    _record_later_faults(harness, result)
    result.faults = dict(
        sorted({**harness.faults, **{f"proxy_{k}": v for k, v in harness.proxy.injected.items()}}.items())
    )
    for kind, count in Counter(p.kind for p in out.poison).items():  # written, not planned
        result.faults[f"poison_{kind}"] = count
    names = {harness.pipeline.target: "target", harness.pipeline.staging: "staging"}
    for (what, stream), count in (harness.proxy.throttle.refused if harness.proxy.throttle else {}).items():
        if count:  # what the limits refused
            result.faults[f"shard_limit_{names.get(stream, 'dead_letter')}_{what}_refused"] = count
    for kind, count in Counter(w.kind for w in harness.proxy.idle_windows()).items():
        result.faults[f"proxy_window_idle_{kind}"] = count  # drawn, but met no request before the run ended
    result.unexpected_exits, result.restarts = harness.unexpected, harness.restarts
    result.proxy_requests = dict(harness.proxy.requests)
    if harness.unexpected >= CRASH_LOOP:
        result.failures.append(f"crash loop: {harness.unexpected} daemon exits the harness did not cause")
    if harness.producer.error is not None:
        result.failures.append(f"producer failed: {harness.producer.error!r}")
    direct = replace(  # the check reads past the proxy
        harness.pipeline.config, target_endpoint=backend.kinesis, state_endpoint=backend.dynamodb
    )
    logs = sorted(workdir.glob("worker-*.log"))
    verdict = check(direct, out, logs, unkeyed_forwarded=harness.hosts.unkeyed_forwarded())
    result.target_records, result.dead_letter_records = verdict.target_records, verdict.dead_letter_records
    result.unkeyed_copies, result.unkeyed_explained = verdict.unkeyed_copies, verdict.unkeyed_explained
    result.target_shards, result.target_shards_closed = verdict.target_shards, verdict.target_shards_closed
    verified = copier_events(logs, {"verified_pending"})
    result.verified_across_settings = sum(1 for e in verified if e.get("settings_changed"))
    result.lost, result.duplicated = verdict.lost, verdict.duplicated
    result.explained_duplicates, result.out_of_order = verdict.explained_duplicates, verdict.out_of_order
    result.extra_copies, result.changed = verdict.extra_copies, verdict.changed
    result.possible_duplicate_reports, result.reported_ids = verdict.possible_duplicate_reports, verdict.reported_ids
    result.check_pages = verdict.pages
    result.unordered, result.scattered_staging = verdict.unordered, verdict.scattered_staging
    result.scattered_target = verdict.scattered_target
    result.failures.extend(verdict.failures)
    _put_timing(harness, result, verdict.unexplained_examples)
    result.ok = not result.failures
    result.total_s = round(time.monotonic() - started, 1)
    return result


def _put_timing(harness: Harness, result: SeedResult, unexplained: Collection[EventValue]) -> None:
    """How long the backend took to answer the puts the proxy forwarded (the slowest, and how many took longer
    than the put timeout: a put received must be readable within it, docs/protocol.md "Assumptions"), and, for
    event IDs with an extra copy no report explains, every put that carried them: when, to which stream, the
    fault it met, and the backend's time. A copy a verification missed because the backend applied its put late
    shows as a forwarded put slower than the timeout, followed by a second put of the same IDs."""
    timeout_s = put_timeout_ms(harness.backend.impl) / 1000
    forwarded = [p.backend_s for p in harness.proxy.puts if p.backend_s is not None]
    result.slowest_put_ms = round(max(forwarded, default=0.0) * 1000)
    result.late_puts = sum(1 for s in forwarded if s > timeout_s)
    if not unexplained:
        return
    names = {harness.pipeline.target: "target", harness.pipeline.config.dead_letter_stream_name: "dead-letter"}
    lines = []
    for event_id in unexplained:
        carried = [
            f"{p.at - harness.t0:.2f} s to {names.get(p.stream, p.stream)} "
            f"({p.fault or 'forwarded'}, {len(p.event_ids)} entries"
            + (f", backend {p.backend_s * 1000:.0f} ms" if p.backend_s is not None else "")
            + ")"
            for p in sorted(harness.proxy.puts, key=lambda p: p.at)
            if any(i == event_id and n not in p.refused for n, i in enumerate(p.event_ids))
        ]
        lines.append(f"{show(event_id)}: {'; '.join(carried) or 'none'}")
    result.failures.append(
        f"puts carrying the unexplained copies (seconds into the plan; the put timeout is {timeout_s:g} s, "
        f"the slowest forwarded put took {result.slowest_put_ms} ms, {result.late_puts} longer than the timeout): "
        + " | ".join(lines)
    )


def _record_later_faults(harness: Harness, result: SeedResult) -> None:
    """Count what was injected of the clock, settings and target-reshard faults, and keep their details."""
    harness.faults.update(harness.hosts.faults())
    reshards = sorted(harness.target_reshards, key=lambda r: r["started"])
    _across_ambiguous_puts(reshards, list(harness.proxy.log), harness.pipeline.target, harness.backend.impl)
    for reshard in reshards:
        harness.faults[reshard["kind"] if reshard["done"] else f"skipped_{reshard['kind']}"] += 1
        if reshard["done"] and reshard["across_ambiguous_put"]:
            harness.faults["target_reshard_across_ambiguous_put"] += 1
        del reshard["started"], reshard["ended"]
    result.target_reshards = reshards
    result.auto_switches = sorted(harness.auto_switches, key=lambda a: a["from_s"])
    streams = {harness.pipeline.target: "target", harness.pipeline.config.dead_letter_stream_name: "dead-letter"}
    result.ambiguous_puts = [
        {"at_s": round(i.at - harness.t0, 2), "kind": i.kind, "stream": streams.get(i.stream, i.stream)}
        for i in harness.proxy.log
        if i.kind in AMBIGUOUS_KINDS
    ]
    result.clock_skew_ms = harness.plan.clock_skew_ms
    result.clocks = harness.hosts.clock_results()
    result.settings = harness.hosts.settings_results()


def _wait_ready(harness: Harness, timeout_s: float) -> float:
    """Wait until every staging shard has a processor (the KCL took a while to start); seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        harness.supervise()
        states = harness.pipeline.shard_states()
        if states and len(states) == harness.plan.staging_shards and all(s.owner for s in states.values()):
            break
        time.sleep(1.0)
    return round(time.monotonic() - started, 1)


def _drive(plan: Plan, harness: Harness, result: SeedResult) -> None:
    for _ in range(plan.workers):
        harness.start_worker()
    result.startup_s = _wait_ready(harness, 120)  # the plan's times count from here: faults hit a busy copier
    t0 = harness.t0 = time.monotonic()
    for window in plan.windows:
        harness.proxy.add(
            FaultWindow(window.kind, t0 + window.start_s, t0 + window.start_s + window.length_s, window.rate)
        )
    threading.Thread(target=harness.producer.run, name="chaos-producer", daemon=True).start()
    pending = [(t0 + action.at_s, index, action, 0) for index, action in enumerate(plan.actions)]
    while pending or not harness.producer.done.is_set():
        now = time.monotonic()
        harness.resume_due(now)
        for item in [p for p in pending if p[0] <= now]:
            pending.remove(item)
            when, index, action, tries = item
            retries = STEP_RETRIES if action.kind == "clock_step" else RETRIES
            if not harness.act(action, index, tries >= retries):  # nothing to act on yet (workers restarting): later
                if tries < retries:
                    pending.append((now + 2.0, index, action, tries + 1))
                else:
                    harness.faults[f"skipped_{action.kind}"] += 1
        harness.supervise()
        time.sleep(0.25)
    for pid in list(harness.stopped):  # no pause outlasts the plan
        harness.stopped[pid] = min(harness.stopped[pid], time.monotonic() + 15)
    settled = time.monotonic()
    deadline = settled + plan.catch_up_s
    last = harness.producer.out.last
    while time.monotonic() < deadline:
        harness.resume_due(time.monotonic())
        harness.supervise()
        if not harness.stopped and harness.pipeline.caught_up(last):
            result.caught_up_s = round(time.monotonic() - settled, 1)
            return
        time.sleep(1.0)
    states = harness.pipeline.shard_states()
    behind = {}
    for shard, position in last.items():
        committed = states[shard].position if shard in states else None
        if committed is None or committed < position:
            behind[shard] = f"{committed} < {position}"
    result.failures.append(f"not caught up within {plan.catch_up_s:.0f} s: stalled shards {behind}")
