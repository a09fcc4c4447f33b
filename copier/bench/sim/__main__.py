"""``python -m copier.bench.sim``: a simulated day of an account running copier, its control-plane calls
against AWS's limits (``copier.bench.sim.day``); prints the figures, and writes them as JSON with ``--json``.

    python -m copier.bench.sim --shards 10000           # what make bench runs (docs/benchmarks.json)
    python -m copier.bench.sim --shards 1000 --per-processor   # before the host share: over the budget
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from copier.bench.sim.day import Day
from copier.bench.sim.report import run, text

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m copier.bench.sim", description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=Day.shards)
    parser.add_argument("--shards-per-host", type=int, default=Day.shards_per_host)
    parser.add_argument("--interval", type=float, default=Day.interval_s, help="seconds a batch stands for")
    parser.add_argument(
        "--per-processor",
        action="store_true",
        help="each processor asks DescribeStreamSummary for itself (copier before the host share)",
    )
    parser.add_argument(
        "--per-host",
        action="store_true",
        help="each host asks DescribeStreamSummary for itself (copier before the application's answers)",
    )
    parser.add_argument("--unthrottled", action="store_true", help="count the calls, refuse none")
    parser.add_argument("--seed", type=int, default=Day.seed)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    day = Day(
        shards=args.shards,
        shards_per_host=args.shards_per_host,
        interval_s=args.interval,
        shared=not args.per_processor,
        application=not (args.per_processor or args.per_host),
        enforce=not args.unthrottled,
        seed=args.seed,
    )
    result = run(day)
    print(text(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["within_budgets"] and result["forwarding_wait_max_s"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
