"""Processor CPU per event of two versions of copier in one run: is a change any slower?

``make bench`` section 1 compares copier with a plain copier, and a cell's
ratio moves by about 0.15 between runs of the same code, so comparing a
cell across two ``make bench`` runs cannot show a change of a few percent.
This runs three processors over the same cases, in rotating order, against
one backend: the plain copier, copier from this tree, and copier from a
*baseline* source tree (a ``git worktree`` of an earlier commit, first on
``PYTHONPATH``), and reports each cell's median ratio of this tree to the
baseline, taken within each repetition so that a noisy machine moves both
alike::

    git worktree add /tmp/base <commit>
    python -m copier.bench.compare --baseline /tmp/base --repeats 5 --out compare.json

Both trees run against the state table this tree creates, so the baseline
must read its format: a tree from before the digest-batch format
(docs/protocol.md, "Upgrading from copier 0.1") cannot. bdad890 and later
trees can (run on 2026-11-26).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from copier.bench.cpu import CpuCase, bench_properties, measure

__all__ = ["CASES", "compare", "main"]

#: Section 1's cases: (payload bytes, batch, events).
CASES = tuple((200, b, 30_000) for b in (10, 100, 1000, 10_000)) + tuple((2048, b, 20_000) for b in (100, 1000, 10_000))


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def compare(
    baseline: Path, cases: tuple[tuple[int, int, int], ...], repeats: int, workdir: Path
) -> list[dict[str, Any]]:
    """One row per case: the three processors' median µs per event and the median per-repetition ratios."""
    import boto3

    from copier.adapters.dynamo import DynamoStateStore
    from copier.adapters.kinesis import paged_shards
    from copier.core.config import load_config
    from copier.local.backend import DUMMY_ENV, LocalBackend
    from copier.local.multilang import COPIER

    if not (baseline / "copier" / "__init__.py").is_file():
        raise SystemExit(f"--baseline {baseline}: not a copier source tree (no copier/__init__.py)")
    for key, value in DUMMY_ENV.items():
        os.environ.setdefault(key, value)
    workdir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with LocalBackend() as backend:
        kinesis = boto3.session.Session(region_name="us-east-1").client("kinesis", endpoint_url=backend.endpoint)
        for name, count in (("bench-staging", len(cases) * repeats * 3), ("bench-target", 4)):
            kinesis.create_stream(StreamName=name, ShardCount=count)
            kinesis.get_waiter("stream_exists").wait(StreamName=name)
        props = bench_properties(workdir / "compare.properties", backend.endpoint)
        DynamoStateStore(load_config(props)).create_table()
        shards = iter(sorted(s["ShardId"] for s in paged_shards(kinesis.list_shards, "bench-staging")))
        copier = [COPIER, "process", "--properties", str(props)]
        commands = {
            "plain": [sys.executable, "-m", "copier.bench.plain", "--properties", str(props)],
            "this": copier,
            "baseline": ["env", f"PYTHONPATH={baseline}", *copier],
        }
        kinds = list(commands)
        for payload_bytes, batch, events in cases:
            _say(f"{payload_bytes} B, batches of {batch}, {events} events, x{repeats} each")
            case = CpuCase(payload_bytes, batch, events)
            spent: dict[str, list[float]] = {kind: [] for kind in kinds}
            for r in range(repeats):
                run = uuid.uuid4().hex[:8]
                for kind in kinds[r % 3 :] + kinds[: r % 3]:
                    spent[kind].append(measure(commands[kind], props, case, next(shards), f"{run}-{kind}"))

            def ratio(a: str, b: str) -> float:
                return round(statistics.median(x / y for x, y in zip(spent[a], spent[b], strict=True)), 3)

            rows.append(
                {
                    "payload_bytes": payload_bytes,
                    "batch": batch,
                    "events": events,
                    "repeats": repeats,
                    **{f"{kind}_us_per_event": round(statistics.median(spent[kind]) * 1e6, 2) for kind in kinds},
                    "baseline_ratio": ratio("baseline", "plain"),
                    "this_ratio": ratio("this", "plain"),
                    "this_over_baseline": ratio("this", "baseline"),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m copier.bench.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a copier source tree to compare with")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions of each case (default 5)")
    parser.add_argument("--out", type=Path, default=Path("compare.json"), help="where the rows go (JSON)")
    parser.add_argument("--smoke", action="store_true", help="one small case, once (for tests)")
    args = parser.parse_args(argv)
    cases = ((200, 1000, 5000),) if args.smoke else CASES
    rows = compare(args.baseline.resolve(), cases, 1 if args.smoke else args.repeats, args.out.parent / "compare-work")
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print("| payload | batch | plain µs | baseline µs | this µs | this / baseline |", file=sys.stderr)
    for row in rows:
        print(
            f"| {row['payload_bytes']} B | {row['batch']} | {row['plain_us_per_event']} | "
            f"{row['baseline_us_per_event']} | {row['this_us_per_event']} | {row['this_over_baseline']} |",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
