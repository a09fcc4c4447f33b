"""``copier plan``: what a workload costs copier, and each AWS API's budget (``copier.core.capacity``).

The edge of the planner: it reads the measured figures (docs/benchmarks.json), the dated price table
(properties/prices-*.json) and the settings (properties/copier.properties), and prints the plan as text,
``--json`` or ``--markdown``; ``--doc`` prints docs/capacity.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from copier.core.capacity import Measured, Plan, Settings, Workload, plan, settings_from
from copier.core.capacityreport import DOC_DAILY_EVENTS, DOC_RECORD_BYTES, as_dict, document, text
from copier.core.errors import PlanError
from copier.core.properties import parse_properties

__all__ = ["add_arguments", "doc_plans", "load", "main"]

ROOT = Path(__file__).resolve().parent.parent.parent  # the source tree: docs/ and properties/ are not installed
BENCHMARKS = ROOT / "docs" / "benchmarks.json"
PRICES = ROOT / "properties" / "prices-us-east-1-2026-11.json"
PROPERTIES = ROOT / "properties" / "copier.properties"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "What a workload costs copier: hosts, the state table, the KCL's tables, Kinesis, and each AWS API's "
        "call rate against its limit (flagged over 50%). Every per-event and per-shard figure is measured "
        "(docs/benchmarks.json); prices come from a dated table you can replace."
    )
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--events-per-day", type=float, help="events produced a day (e.g. 1e10)")
    rate.add_argument("--events-per-second", type=float, help="events produced a second")
    p.add_argument("--shards", type=int, help="staging shards, all regions (default: the fewest under 50%% of writes)")
    p.add_argument("--record-bytes", type=int, default=200, help="a record's data and key (default: %(default)s)")
    p.add_argument("--duplicates", type=float, default=0.03, help="producer duplicate rate (default: %(default)s)")
    p.add_argument("--window-hours", type=float, default=1.0, help="copier.dedupWindowSeconds in hours")
    p.add_argument("--retention-hours", type=float, default=24.0, help="the staging stream's retention")
    p.add_argument("--regions", type=int, default=1, help="regions the events are spread over evenly")
    p.add_argument("--retrieval", choices=("POLLING", "FANOUT"), default="POLLING")
    p.add_argument("--instance", default="auto", help="an instance type of the price table (default: cheapest)")
    p.add_argument("--utilization", type=float, default=0.6, help="share of a host's CPU and memory to fill")
    p.add_argument("--min-hosts", type=int, default=2, help="hosts a region at least (default: %(default)s)")
    p.add_argument("--benchmarks", type=Path, default=BENCHMARKS, help="measured figures (default: docs/)")
    p.add_argument("--prices", type=Path, default=PRICES, help="the price table (default: %(default)s)")
    p.add_argument("--properties", type=Path, default=PROPERTIES, help="settings (default: the shipped file)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the plan as JSON, for scripts")
    out.add_argument("--doc", action="store_true", help="print docs/capacity.md (the workloads it holds)")


def _read(path: Path, what: str) -> Any:
    """A file's text, or its json; one that cannot be read is a :class:`PlanError` naming the flag to give
    (an installed copier has no docs/ or properties/: they are the source tree's)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(f"copier plan: cannot read {path} ({exc.strerror}): give {what}") from exc
    return json.loads(text) if path.suffix == ".json" else text


def load(benchmarks: Path, prices: Path, properties: Path) -> tuple[Measured, dict[str, Any], Settings]:
    """The measured figures, the price table and the settings, from their files."""
    values = {k: v for k, (_, v) in parse_properties(_read(properties, "--properties FILE")).items()}
    return (
        Measured(_read(benchmarks, "--benchmarks FILE (docs/benchmarks.json)")),
        _read(prices, "--prices FILE"),
        settings_from(values),
    )


def doc_plans(measured: Measured, prices: dict[str, Any], settings: Settings) -> list[Plan]:
    """The plans docs/capacity.md shows, at the planner's defaults."""
    base = Workload(events_per_s=1.0, record_bytes=1)
    return [
        plan(replace(base, events_per_s=day / 86_400, record_bytes=size), settings, measured, prices)
        for day in DOC_DAILY_EVENTS
        for size in DOC_RECORD_BYTES
    ]


def _sources(args: argparse.Namespace, measured: Measured, prices: dict[str, Any]) -> dict[str, str]:
    def name(path: Path) -> str:
        return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)

    return {
        "benchmarks": f"`{name(args.benchmarks)}` (`make bench`, {measured.raw['method']['date']})",
        "prices": f"`{name(args.prices)}` ({prices['region']}, {prices['date']}; {', '.join(prices['sources'])})",
        "properties": f"`{name(args.properties)}`",
    }


def main(args: argparse.Namespace) -> int:
    try:
        measured, prices, settings = load(args.benchmarks, args.prices, args.properties)
        if args.doc:
            sys.stdout.write(document(doc_plans(measured, prices, settings), _sources(args, measured, prices)))
            return 0
        if args.events_per_day is None and args.events_per_second is None:
            raise PlanError("copier plan: give --events-per-day or --events-per-second")
        workload = Workload(
            events_per_s=args.events_per_second or args.events_per_day / 86_400,
            record_bytes=args.record_bytes,
            duplicate_rate=args.duplicates,
            window_hours=args.window_hours,
            retention_hours=args.retention_hours,
            regions=args.regions,
            retrieval=args.retrieval,
            instance=args.instance,
            shards=args.shards,
            utilization=args.utilization,
            min_hosts=args.min_hosts,
        )
        result = plan(workload, settings, measured, prices)
    except PlanError as exc:
        print(exc, file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(as_dict(result), indent=2) + "\n" if args.json else text(result))
    return 0
