"""A capacity plan as text, as a dict for ``--json``, and docs/capacity.md (``copier.core.capacity``).

Pure: plans in, strings and dicts out; ``copier.commands.plan`` prints them. docs/capacity.md is this
module's :func:`document` of the workloads in :data:`DOC_WORKLOADS`, so its numbers are the planner's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from copier.core.capacity import UNKNOWNS, Plan
from copier.core.capacitylines import (
    DESCRIBE_STREAM_SUMMARY_PER_ACCOUNT_S,
    FLAG_SHARE,
    PARTITION_RCU,
    TABLE_RCU,
    Budget,
)

__all__ = ["DOC_DAILY_EVENTS", "DOC_RECORD_BYTES", "as_dict", "document", "remedy", "text"]

DOC_DAILY_EVENTS = (1e9, 1e10, 1e11)  # the scale: 1, 10 and 100 billion events a day
DOC_RECORD_BYTES = (200, 2048)

# What to do about a budget that binds, by API (the first word of the budget's name).
REMEDIES = {
    "DescribeStreamSummary": "a quota increase for DescribeStreamSummary (Service Quotas), or fewer applications "
    "in the account: each application asks for each stream every 2.4 to 4.8 minutes, whatever its hosts",
    "GetItem": "nothing to do below 3,000 hosts: each host reads a stream's answer once per refresh, one item a "
    "stream",
    "DescribeStream": "nothing of copier's: it never calls DescribeStream",
    "ListShards": "a quota increase, or the target split over streams: each host lists the whole target every "
    "300 s for its processors (a page per 1,000 shards), so the rate grows with hosts times pages",
    "GetShardIterator": "fewer takeovers (stable workerIds, rolling deploys)",
    "GetRecords": "FANOUT (copier.retrievalMode), which gives copier its own 2 MiB a second a shard, or more "
    "staging shards",
    "SubscribeToShard": "more staging shards",
    "PutRecords": "more target shards (a target shard takes a staging shard's forwarded events)",
    "state": "larger chunks (under POLLING a longer idleTimeBetweenReadsInMillis: more events a delivery, fewer "
    "write units an event, docs/benchmarks.md section 2, at the price of latency), or a quota increase for the "
    "table's write units",
    "KCL": "a quota increase for the table, or a longer failoverTimeMillis (fewer renewals)",
}


def remedy(budget: Budget) -> str:
    """What to do about ``budget`` when it binds."""
    return REMEDIES[budget.api.split()[0]]


def _rate(value: float, unit: str) -> str:
    if unit == "bytes/s":
        return f"{value / 1024:,.1f} KiB/s"
    return f"{value:,.3g} {unit}" if value < 10 else f"{value:,.0f} {unit}"


def _limit(value: float, unit: str) -> str:
    return f"{value / 1024 / 1024:g} MiB/s" if unit == "bytes/s" else f"{value:,g} {unit}"


def _usd(value: float) -> str:
    return f"${value:,.2f}"


def as_dict(p: Plan) -> dict[str, Any]:
    """The plan for ``--json``: every field, the lines and budgets with their shares and flags."""
    found = asdict(p)
    found["budgets"] = [{**asdict(b), "share": b.share, "flagged": b.flagged} for b in p.budgets]
    found["figures"] = dict(p.figures)
    found["usd_day"], found["own_usd_day"], found["kinesis_usd_day"] = p.usd_day, p.own_usd_day, p.kinesis_usd_day
    found["own_share_of_kinesis"] = p.own_usd_day / p.kinesis_usd_day
    found["start_summary_calls"] = p.start_summary_calls
    if p.host_loss is not None:
        loss = p.host_loss
        found["host_loss"] |= {
            "iterator_s": loss.iterator_s,
            "read_s": loss.read_s,
            "window_read_s": loss.window_read_s,
        }
    found["start_window_read_s"] = p.start_window_read_s
    found["unknowns"] = list(UNKNOWNS)
    return found


def _summary(p: Plan) -> list[str]:
    w = p.workload
    region = f" in each of {w.regions} regions" if w.regions > 1 else ""
    return [
        f"{w.events_per_s:,.0f} events/s of {w.record_bytes:,} B, {w.duplicate_rate:.0%} duplicates, "
        f"a {w.window_hours:g} h window, {w.retention_hours:g} h staging retention, {w.retrieval}",
        f"{p.shards:,} staging shards{region}, {p.events_per_shard_s:,.0f} events/s a shard, "
        f"chunks of {p.chunk_events:,.0f} events",
        f"{p.hosts:,} x {p.instance}{region} ({p.instance_vcpus} vCPUs, {p.instance_memory_gib:g} GiB): "
        f"{p.shards_per_host:,} shards a host, {p.host_memory_gib:,.1f} GiB and {p.host_cpu_cores:,.1f} cores "
        f"used ({w.utilization:.0%} the most planned)",
        f"CPU {p.copier_us_per_event:.1f} µs an event in copier's processor "
        f"(the plain at-least-once copier: {p.plain_us_per_event:.1f})",
        f"state table: {p.state_storage_gib:,.1f} GiB of digests{region}; a takeover reads "
        f"{p.takeover_read_units:,.0f} read units a shard",
        f"a fleet start asks DescribeStreamSummary {p.start_summary_calls:,} times at once: "
        f"{p.start_summary_calls / DESCRIBE_STREAM_SUMMARY_PER_ACCOUNT_S:,.1f} s of the account's budget; "
        f"loading every window takes {p.start_window_read_s:,.0f} s of the state table's reads",
    ] + _host_loss(p)


def _host_loss(p: Plan) -> list[str]:
    loss = p.host_loss
    if loss is None:
        return []
    return [
        f"a host loss, at most: {loss.processors:,} successors verify a chunk in flight each, reading "
        f"{loss.target_shards_a_chunk:,.0f} target shards apiece ({loss.bytes_a_reader / 2**20:,.1f} MiB each); "
        f"a target shard is read by {loss.readers_a_target_shard:,.1f} of them: {loss.iterator_s:,.1f} s of its "
        f"GetShardIterator budget and {loss.read_s:,.1f} s of its GetRecords budget, shared with its consumers; "
        f"their windows take {loss.window_read_s:,.1f} s of the state table's reads"
    ]


def text(p: Plan) -> str:
    """The plan for a terminal."""
    out = _summary(p) + ["", "a day, all regions:"]
    out += [f"  {line.name:<28} {line.quantity:>18,.0f} {line.unit:<22} {_usd(line.usd_day):>12}" for line in p.lines]
    out += [
        f"  {'total':<28} {'':>18} {'':<22} {_usd(p.usd_day):>12}",
        f"  copier's own {_usd(p.own_usd_day)}: {p.own_usd_day / p.kinesis_usd_day:.1%} of the streams' "
        f"{_usd(p.kinesis_usd_day)}",
        "",
        f"budgets, one region (! over {FLAG_SHARE:.0%}):",
    ]
    for b in p.budgets:
        mark = "!" if b.flagged else " "
        out.append(
            f" {mark}{b.api:<24} per {b.scope:<31} {_rate(b.rate, b.unit):>16} of {_limit(b.limit, b.unit):<16}"
            f" {b.share:>7.1%}  ({b.caller})"
        )
    out += ["", "from docs/benchmarks.json:"] + [f"  {name} = {value:g}" for name, value in p.figures]
    return "\n".join(out) + "\n"


def _budget_table(p: Plan) -> list[str]:
    rows = ["| API or table | limit per | copier's rate | limit | share | who calls |", "|---|---|---|---|---|---|"]
    for b in p.budgets:
        share = f"**{b.share:.1%}**" if b.flagged else f"{b.share:.1%}"
        rows.append(
            f"| {b.api} | {b.scope} | {_rate(b.rate, b.unit)} | {_limit(b.limit, b.unit)} | {share} | {b.caller} |"
        )
    return rows


def document(plans: Sequence[Plan], sources: Mapping[str, str]) -> str:
    """docs/capacity.md: the plans for :data:`DOC_DAILY_EVENTS` x :data:`DOC_RECORD_BYTES`; ``sources``
    names the files the figures came from (benchmarks, prices, properties) and their dates."""
    first = plans[0].workload
    out = [
        "# Capacity",
        "",
        "Generated by `copier plan --doc` (`copier.core.capacityreport`; `make bench` runs it after measuring);",
        "`tests/test_capacity.py` regenerates it and fails if this file differs, so the numbers are the planner's.",
        f"The planner's per-event and per-shard figures are measured: {sources['benchmarks']}.",
        f"Prices: {sources['prices']}.",
        f"Settings: {sources['properties']}. Run `copier plan --help` for your own workload.",
        "",
        f"Every workload: {first.duplicate_rate:.0%} producer duplicates, a {first.window_hours:g}-hour window, "
        f"{first.retention_hours:g} hours of staging retention, {first.retrieval}, one region, the staging and the",
        f"target stream with the fewest shards that keep producers under {FLAG_SHARE:.0%} of a shard's write limit,",
        f"hosts filled to {first.utilization:.0%} of CPU and memory, at least {first.min_hosts}, on the instance "
        "type of the price table whose fleet costs least.",
        "",
        "## Summary",
        "",
        "| events a day | record | shards | hosts | memory a host | CPU a host | state table | Kinesis a day | "
        "copier a day | copier / Kinesis | binds first |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in plans:
        w, bound = p.workload, p.first_bound()
        out.append(
            f"| {w.events_per_s * 86_400 / 1e9:g} billion | {w.record_bytes:,} B | {p.shards:,} | "
            f"{p.hosts:,} x {p.instance} | {p.host_memory_gib:,.1f} of {p.instance_memory_gib:g} GiB | "
            f"{p.host_cpu_cores:,.1f} of {p.instance_vcpus} vCPUs | {p.state_storage_gib:,.1f} GiB | "
            f"{_usd(p.kinesis_usd_day)} | {_usd(p.own_usd_day)} | {p.own_usd_day / p.kinesis_usd_day:.1%} | "
            f"{bound.api} per {bound.scope} ({bound.share:.0%}) |"
        )
    out += [
        "",
        "*Kinesis a day* is the staging and the target stream (shard-hours and PUT payload units), which the",
        "user pays whatever copies the events; *copier a day* is what copier adds: its hosts, its state table",
        "(writes and digest storage) and the KCL's tables (and with FANOUT the fan-out consumer).",
        "",
        "## The limits that bind first, and what to do",
        "",
    ]
    seen: dict[str, list[str]] = {}
    for p in plans:
        for b in p.budgets:
            if b.flagged:
                w = p.workload
                seen.setdefault(f"{b.api} per {b.scope}", []).append(
                    f"{w.events_per_s * 86_400 / 1e9:g} billion of {w.record_bytes:,} B ({b.share:.0%})"
                )
    if not seen:
        out.append(f"No budget is over {FLAG_SHARE:.0%} in these plans.")
    for name, where in seen.items():
        budget = next(b for p in plans for b in p.budgets if f"{b.api} per {b.scope}" == name)
        out.append(f"- **{name}**, over {FLAG_SHARE:.0%} at {', '.join(where)}: {remedy(budget)}.")
    out += [
        "",
        "A fleet start asks DescribeStreamSummary once per stream (the first host's checks post the answers in the",
        "state table, and the other hosts' take them while at most 30 s old; a takeover on a running host asks",
        "nothing), and every processor loads its window from the",
        "state table (strongly consistent reads, at most a partition's",
        f"{PARTITION_RCU:,} read units a second and the table's default {TABLE_RCU:,}; a quota increase raises the "
        "table's):",
        "",
        "| events a day | record | shards | DescribeStreamSummary calls at once | seconds of the account's "
        f"{DESCRIBE_STREAM_SUMMARY_PER_ACCOUNT_S} a second | seconds of the state table's reads |",
        "|---|---|---|---|---|---|",
    ]
    for p in plans:
        calls, w = p.start_summary_calls, p.workload
        out.append(
            f"| {w.events_per_s * 86_400 / 1e9:g} billion | {w.record_bytes:,} B | {p.shards:,} | {calls:,} | "
            f"{calls / DESCRIBE_STREAM_SUMMARY_PER_ACCOUNT_S:,.1f} | {p.start_window_read_s:,.0f} |"
        )
    out += [
        "",
        "A host lost with a chunk in flight on each of its shards (at most) has each successor verify that chunk by",
        "reading the target shards its keys hash to (`copier.shard.inflight`), shared with the target's consumers,",
        "and load its window from the state table; fewer shards a host (a smaller instance, `--instance`) or a",
        "shorter `copier.leaseMillis` shortens it:",
        "",
        "| events a day | record | processors lost | readers a target shard | seconds of a target shard's "
        "GetShardIterator | seconds of its GetRecords | seconds of the state table's reads |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in plans:
        w, loss = p.workload, p.host_loss
        if loss is not None:
            out.append(
                f"| {w.events_per_s * 86_400 / 1e9:g} billion | {w.record_bytes:,} B | {loss.processors:,} | "
                f"{loss.readers_a_target_shard:,.1f} | {loss.iterator_s:,.1f} | {loss.read_s:,.1f} | "
                f"{loss.window_read_s:,.1f} |"
            )
    for p in plans:
        w = p.workload
        out += ["", f"## {w.events_per_s * 86_400 / 1e9:g} billion events a day of {w.record_bytes:,} B", ""]
        out += [f"- {line}" for line in _summary(p)]
        out += ["", "| a day | quantity | unit | cost |", "|---|---|---|---|"]
        out += [f"| {x.name} | {x.quantity:,.0f} | {x.unit} | {_usd(x.usd_day)} |" for x in p.lines]
        out += [f"| total | | | {_usd(p.usd_day)} |", ""] + _budget_table(p)
    out += ["", "## The measured figures used", "", "| docs/benchmarks.json | value |", "|---|---|"]
    figures = {name: value for p in plans for name, value in p.figures}
    out += [f"| `{name}` | {value:g} |" for name, value in sorted(figures.items())]
    out += ["", "## What the planner cannot know", ""] + [f"- {item}." for item in UNKNOWNS]
    return "\n".join(out) + "\n"
