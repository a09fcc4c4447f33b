"""The simulated day's figures: each API's peak and mean call rate against its limit and scope, whose calls
they were, how many were throttled, and how long forwarding waited on a control-plane call.

A budget is copier's share of a limit: ``copier.core.capacitylines.FLAG_SHARE`` of it, the rest reserved for
the KCL and every other application of the account (the share ``copier plan`` flags beyond). The peak is the
most calls made in one second on one scope key (the account, one stream, one shard), throttled ones included:
a refused call spends the caller's attempt all the same.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from copier.bench.sim.account import LIMITS
from copier.bench.sim.day import Day, Outcome, phase_of, simulate
from copier.core.capacitylines import FLAG_SHARE

__all__ = ["ApiFigures", "figures", "markdown", "run", "summary", "text"]

CALLERS = ("copier", "kcl")


@dataclass(frozen=True)
class ApiFigures:
    """One API's day, for one caller (``copier``, ``kcl``, or ``all``: both together)."""

    api: str
    caller: str
    scope: str
    limit: float  # calls a second per scope key
    budget: float  # copier's: the limit less the reserve
    calls: int
    throttled: int
    peak: int  # the most calls in one second on one scope key
    peak_at: int  # that second (from the day's start)
    peak_during: str  # the day's event then
    mean: float  # calls a second, the busiest scope key's, over the day

    @property
    def within(self) -> bool:
        """copier's calls within its budget (the KCL's are counted against the reserve, not judged here)."""
        return self.caller != "copier" or self.peak <= self.budget


def _merge(tables: list[dict[str, dict[int, int]]]) -> dict[str, dict[int, int]]:
    merged: dict[str, dict[int, int]] = {}
    for table in tables:
        for key, seconds in table.items():
            into = merged.setdefault(key, {})
            for second, count in seconds.items():
                into[second] = into.get(second, 0) + count
    return merged


def figures(out: Outcome) -> list[ApiFigures]:
    """Each API's figures: per caller, and for both together where both call it."""
    found: list[ApiFigures] = []
    duration = out.day.duration_s
    for api, limit in LIMITS.items():
        tables = {caller: out.account.calls.get((api, caller), {}) for caller in CALLERS}
        rows = [(caller, tables[caller]) for caller in CALLERS]
        if all(tables.values()):
            rows.append(("all", _merge(list(tables.values()))))
        for caller, table in rows:
            peak, peak_at, busiest = 0, 0, 0
            for seconds in table.values():
                busiest = max(busiest, sum(seconds.values()))
                for second, count in seconds.items():
                    if count > peak:
                        peak, peak_at = count, second
            throttled = sum(out.account.throttled.get((api, c), 0) for c in CALLERS if caller in (c, "all"))
            found.append(
                ApiFigures(
                    api=api,
                    caller=caller,
                    scope=limit.scope,
                    limit=limit.rate,
                    budget=limit.rate * FLAG_SHARE,
                    calls=sum(sum(s.values()) for s in table.values()),
                    throttled=throttled,
                    peak=peak,
                    peak_at=peak_at,
                    peak_during=phase_of(peak_at) if peak else "",
                    mean=busiest / duration,
                )
            )
    return found


def summary(out: Outcome, cpu_s: float | None = None) -> dict[str, Any]:
    """The day's figures as JSON: what was simulated, each API's figures, the waits and the switches' lags."""
    apis = figures(out)
    return {
        "day": asdict(out.day),
        "hosts": out.hosts,
        "batches": out.batches,
        "cpu_seconds": cpu_s,
        "reserve_share": 1 - FLAG_SHARE,
        "apis": [asdict(a) | {"within": a.within} for a in apis],
        "get_records_per_shard_s": 1 / out.day.idle_s,  # the KCL's, by the representation (module docstring)
        "forwarding_wait_max_s": max(out.batch_waits, default=0.0),
        "takeover_wait_max_s": max(out.takeover_waits, default=0.0),
        "takeovers": len(out.takeover_waits),
        "preflight_failures": out.preflight_failures,
        "switch_seen_within_s": out.switch_lag,
        "within_budgets": all(a.within for a in apis),
    }


def run(day: Day) -> dict[str, Any]:
    """Simulate ``day``; its :func:`summary`, with the CPU seconds it took."""
    started = time.process_time()
    out = simulate(day)
    return summary(out, round(time.process_time() - started, 1))


def _mode(day: dict[str, Any]) -> str:
    """How DescribeStreamSummary answers are shared in the simulated fleet."""
    if not day["shared"]:
        return "each processor asking for itself"
    return "one answer per application (the state table)" if day.get("application") else "one answer per host"


def text(result: dict[str, Any]) -> str:
    """The figures as a short text: a line an API and caller, then the waits."""
    day = result["day"]
    mode = _mode(day)
    lines = [
        f"control-plane simulation: {day['shards']} staging shards, {result['hosts']} hosts of "
        f"{day['shards_per_host']}, {day['duration_s'] / 3600:g} h, a batch per processor every "
        f"{day['interval_s']:g} s, DescribeStreamSummary {mode}; budgets: the limit less "
        f"{result['reserve_share']:.0%} for the KCL and other applications",
        f"{'API':22} {'caller':7} {'scope':15} {'limit/s':>8} {'budget':>7} {'peak/s':>7} {'mean/s':>9} "
        f"{'calls':>9} {'throttled':>9}  peak during",
    ]
    for a in result["apis"]:
        if not a["calls"]:
            continue
        flag = "" if a["within"] else "  OVER BUDGET"
        lines.append(
            f"{a['api']:22} {a['caller']:7} {a['scope']:15} {a['limit']:8g} {a['budget']:7g} {a['peak']:7d} "
            f"{a['mean']:9.4f} {a['calls']:9d} {a['throttled']:9d}  {a['peak_during']}{flag}"
        )
    lines.append(
        f"GetRecords: the KCL's, {result['get_records_per_shard_s']:g}/s a shard (idleTimeBetweenReadsInMillis), "
        "represented, not simulated call by call"
    )
    lines.append(
        f"forwarding waited at most {result['forwarding_wait_max_s']:g} s on a control-plane call "
        f"({result['batches']} batches); a takeover at most {result['takeover_wait_max_s']:g} s "
        f"({result['takeovers']} takeovers); preflight failures {result['preflight_failures']}"
    )
    for name, lag in result["switch_seen_within_s"].items():
        lines.append(f"{name}: every processor running then acted on it within {lag:.0f} s")
    return "\n".join(lines)


def markdown(result: dict[str, Any]) -> list[str]:
    """docs/benchmarks.md's section on the simulated day (none when the part was not run)."""
    if not result:
        return []
    day = result["day"]
    lines = [
        f"## 7. The control plane at {day['shards']:,} shards (simulated)",
        "",
        f"A simulated day (`python -m copier.bench.sim`, `copier.bench.sim`) of {day['shards']:,} staging shards on",
        f"{result['hosts']} hosts of {day['shards_per_host']}: a fleet start, splits and merges of both streams,",
        "the target switched to AUTO and back and its record limit raised, a host lost, a rolling deploy. Each",
        "processor makes its control-plane calls through copier's own code (`KinesisStreams`, the host's shared",
        f"answers and listings, DescribeStreamSummary {_mode(day)}, `ShardSession`, `StreamGuard`) against a fake",
        "account that enforces AWS's limits (the state table's item: its partition's read and write units,",
        f"GetItem and PutItem); a batch every {day['interval_s']:g} s stands for a processor's chunks. A budget is",
        f"the limit less {result['reserve_share']:.0%} kept for the KCL and other applications; the peak is the",
        f"most calls in one second on one scope key. {result['cpu_seconds']} CPU seconds.",
        "",
        "| API | caller | scope | limit/s | budget/s | peak/s | mean/s | throttled | peak during | copier's peak |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in result["apis"]:
        if a["calls"]:
            verdict = "" if a["caller"] != "copier" else "within budget" if a["within"] else "**over budget**"
            lines.append(
                f"| {a['api']} | {a['caller']} | {a['scope']} | {a['limit']:g} | {a['budget']:g} | {a['peak']} | "
                f"{a['mean']:.4f} | {a['throttled']} | {a['peak_during']} | {verdict} |"
            )
    over = [a["api"] for a in result["apis"] if a["calls"] and not a["within"]]
    lines += [
        "",
        "copier's calls stay within every budget at their peak second."
        if not over
        else f'Over its budget at its peak second: {", ".join(over)} (see docs/operations.md, "The AWS API budget").',
        "",
        f"Forwarding waited at most {result['forwarding_wait_max_s']:g} s on a control-plane call over "
        f"{result['batches']:,} batches; a takeover at most {result['takeover_wait_max_s']:g} s. "
        + " ".join(f"{name}: acted on within {lag:.0f} s." for name, lag in result["switch_seen_within_s"].items()),
        "",
    ]
    return lines
