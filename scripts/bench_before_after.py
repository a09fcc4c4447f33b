"""Before and after: every figure of docs/benchmarks.json set beside the same figure of a baseline run.

`make bench` writes docs/benchmarks.json from the code it ran on. This sets
each figure the round's issues promised or touched (CPU per event against the
plain copier, DynamoDB write units per event, memory per shard, time to first
event and to take over, the rolling deploy's longest pause, a redrive's and a
repair's cost, the 10,000-shard simulation's API rates, the window's bytes per
ID, end-to-end throughput) beside the baseline's, into
docs/benchmarks-before-after.md. The baseline, docs/benchmarks-before.json, is
an earlier `make bench` committed as it was (its "source" says which commit it
came from); a figure the baseline did not measure says so instead of a number.

It lives outside the copier package on purpose: the chaos run's code digest is
of the code that runs, and this only reads results. `make bench` runs it after
the benchmarks; tests/test_bench_before_after.py checks the committed page is
its output.

Usage: python scripts/bench_before_after.py [DOCS_DIR]   (rewrites DOCS_DIR/benchmarks-before-after.md)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

BEFORE = "benchmarks-before.json"
AFTER = "benchmarks.json"
PAGE = "benchmarks-before-after.md"

Row = tuple[str, Any, Any]  # (figure, before, after): None where a run did not measure it


def _get(data: dict[str, Any], *path: Any) -> Any:
    """The value at ``path`` (dict keys, or a callable picking one list entry), None where any step is absent."""
    value: Any = data
    for step in path:
        if callable(step):
            value = step(value) if isinstance(value, list) else None
        elif isinstance(value, dict):
            value = value.get(step)
        else:
            return None
        if value is None:
            return None
    return value


def _where(**match: Any) -> Callable[[list[dict[str, Any]]], dict[str, Any] | None]:
    """The first list entry whose fields equal ``match``."""

    def pick(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
        return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)

    return pick


def _cases(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[int, int]]:
    """The CPU table's cells (payload bytes, batch) of either run, in order."""
    cells = {(r["payload_bytes"], r["batch"]) for run in (before, after) for r in run.get("cpu", [])}
    return sorted(cells)


def rows(before: dict[str, Any], after: dict[str, Any]) -> Iterator[tuple[str, list[Row]]]:
    """Each section's rows: the same path read in both runs."""

    def pair(label: str, *path: Any) -> Row:
        return label, _get(before, *path), _get(after, *path)

    cpu: list[Row] = []
    for size, batch in _cases(before, after):
        cell = _where(payload_bytes=size, batch=batch)
        cpu.append(pair(f"{size} B, batches of {batch}: copier / plain", "cpu", cell, "ratio"))
        cpu.append(pair(f"{size} B, batches of {batch}: copier µs/event", "cpu", cell, "copier_us_per_event"))
        if _get(after, "cpu", cell, "uncoalesced_ratio") is not None:
            cpu.append(pair(f"{size} B, batches of {batch}: coalescing off / plain", "cpu", cell, "uncoalesced_ratio"))
    yield "Processor CPU per event against the plain copier (section 1)", cpu

    units = sorted({int(k) for run in (before, after) for k in _get(run, "cost", "copier_units_per_million") or {}})
    cost = [
        pair(f"deliveries of {n}: write units per million events", "cost", "copier_units_per_million", str(n))
        for n in units
    ]
    coalesced = sorted(
        {int(k) for run in (before, after) for k in _get(run, "cost", "coalesced_units_per_million") or {}}
    )
    cost += [
        pair(
            f"deliveries of {n}, coalesced: write units per million events",
            "cost",
            "coalesced_units_per_million",
            str(n),
        )
        for n in coalesced
    ]
    yield "DynamoDB write units (section 2)", cost

    yield (
        "Memory per shard and time to first event (section 6)",
        [
            pair("idle processor, lean path: RSS MB", "memory", _where(path="lean"), "rss_mb"),
            pair("idle processor, lean path: PSS MB", "memory", _where(path="lean"), "pss_mb"),
            pair("8-shard host: processor PSS MB", "host", _where(shards=8), "processor_pss_mb"),
            pair("64-shard host: processor PSS MB", "host", _where(shards=64), "processor_pss_mb"),
            pair("8-shard host: every shard's first event, s", "host", _where(shards=8), "all_first_event_s"),
            pair("64-shard host: every shard's first event, s", "host", _where(shards=64), "all_first_event_s"),
            *[
                pair(
                    f"start, {settings} settings, {worker} workerId: {what} s",
                    "startup",
                    _where(settings=settings, worker_id=worker),
                    key,
                )
                for settings in ("local", "production")
                for worker in ("new each run", "stable")
                for what, key in (("fresh", "fresh_s"), ("restart", "restart_s"), ("crash takeover", "crash_s"))
            ],
        ],
    )

    yield (
        "Rolling deploy (section 6)",
        [
            pair(f"{restart}: longest pause of a shard, s", "rolling", _where(restart=restart), "longest_pause_s")
            for restart in ("in place, own workerId", "new worker")
        ]
        + [
            pair(f"{restart}: {key}", "rolling", _where(restart=restart), key)
            for restart in ("in place, own workerId", "new worker")
            for key in ("lost", "duplicated")
        ],
    )

    yield (
        "A redrive and a repair",
        [
            pair(f"{source}: write units per event", "sources", source, "write_units_per_event")
            for source in ("redrive", "repair")
        ]
        + [
            pair(f"{source}: digest batch bytes per event", "sources", source, "digest_batch_bytes_per_event")
            for source in ("redrive", "repair")
        ],
    )

    sim: list[Row] = [pair("hosts", "simulation", "hosts")]
    for api in ("DescribeStreamSummary", "ListShards", "GetShardIterator", "GetRecords"):
        caller = _where(api=api, caller="copier")
        sim.append(pair(f"{api} (copier): peak calls/s", "simulation", "apis", caller, "peak"))
        sim.append(pair(f"{api} (copier): mean calls/s", "simulation", "apis", caller, "mean"))
    sim.append(pair("every copier rate within its budget", "simulation", "within_budgets"))
    sim.append(pair("forwarding's longest wait on a control-plane call, s", "simulation", "forwarding_wait_max_s"))
    yield "The simulated day at 10,000 shards (section 7)", sim

    yield (
        "The dedup window and end to end (sections 3 and 4)",
        [
            pair("3.6 million IDs: bytes per ID", "window", _where(ids=3_600_000), "bytes_per_id"),
            pair("3.6 million IDs: takeover s", "window", _where(ids=3_600_000), "takeover_s"),
            pair("1 shard: copier events/s", "e2e", _where(kind="copier", shards=1), "throughput_eps"),
            pair("1 shard: plain events/s", "e2e", _where(kind="plain", shards=1), "throughput_eps"),
            pair("1 shard: copier p99 latency ms", "e2e", _where(kind="copier", shards=1), "latency_p99_ms"),
        ],
    )


def _text(value: Any) -> str:
    if value is None:
        return "not measured"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _change(before: Any, after: Any) -> str:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (before, after))
    if not numbers or before == 0:
        return ""
    return f"{(after - before) / before * 100:+.0f}%"


def page(docs: Path) -> str:
    """The page: the baseline's provenance, then one table per section."""
    before = json.loads((docs / BEFORE).read_text(encoding="utf-8"))
    after = json.loads((docs / AFTER).read_text(encoding="utf-8"))
    method = _get(after, "method") or {}
    lines = [
        "# Benchmarks before and after",
        "",
        f"Generated by `scripts/bench_before_after.py` (`make bench` runs it) from [{AFTER}]({AFTER}) and the",
        f"baseline [{BEFORE}]({BEFORE}). Each run measures copier against baselines of its own run",
        "(docs/benchmarks.md says how); a CPU ratio moves by about 0.15 between runs of the same code, so a",
        "change smaller than that is not a change of the code.",
        "",
        f"- before: {before.get('source', 'no source given')}",
        f"- after: `{method.get('command')}` on {method.get('date')}{_code(method)}",
        *[f"  - then `{r.get('command')}` on {r.get('date')}{_code(r)}" for r in method.get("reruns", [])],
        "",
    ]
    for title, section in rows(before, after):
        lines += [f"## {title}", "", "| figure | before | after | change |", "|---|---|---|---|"]
        lines += [f"| {label} | {_text(b)} | {_text(a)} | {_change(b, a)} |" for label, b, a in section]
        lines.append("")
    return "\n".join(lines)


def _code(run: dict[str, Any]) -> str:
    """Which copier a run measured (the digest a chaos seed's result carries), where the run kept it."""
    return f", code digest {run['code']}" if run.get("code") else ""


def rewrite(docs: Path) -> None:
    (docs / PAGE).write_text(page(docs), encoding="utf-8")


if __name__ == "__main__":
    rewrite(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "docs")
