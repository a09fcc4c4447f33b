"""``python -m copier.chaos``: run chaos seeds on one local backend and write the report.

    python -m copier.chaos --seeds 50                 # seeds 1..50, the full profile (make chaos)
    python -m copier.chaos --seed 7 --seed 12         # chosen seeds
    python -m copier.chaos --profile smoke --seeds 2  # the short run of make test

Each seed's plan, results and worker logs go to ``--workdir/seed-N``; the
summary and the per-seed table go to ``--report`` (Markdown) and ``--json``.
Exit status 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from copier.chaos.report import render
from copier.chaos.run import SeedResult, run_seed
from copier.chaos.schedule import FULL, SMOKE, draw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m copier.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=0, help="run seeds 1..N")
    parser.add_argument("--seed", type=int, action="append", default=[], help="run this seed (repeatable)")
    parser.add_argument("--profile", choices=["full", "smoke"], default="full")
    parser.add_argument("--workdir", help="where each seed's logs go (default: a temporary directory)")
    parser.add_argument("--report", help="write the Markdown report here")
    parser.add_argument("--json", dest="json_path", help="write the raw results here")
    args = parser.parse_args(argv)
    seeds = args.seed + list(range(1, args.seeds + 1))
    if not seeds:
        parser.error("give --seeds N or --seed S")
    from copier.local.backend import DUMMY_ENV, LocalBackend

    for key, value in DUMMY_ENV.items():
        os.environ.setdefault(key, value)
    from copier.logs import configure_logging

    configure_logging("WARNING")
    profile = FULL if args.profile == "full" else SMOKE
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="copier-chaos-"))
    command = "python -m copier.chaos " + " ".join(argv if argv is not None else sys.argv[1:])
    results: list[SeedResult] = []
    started = time.monotonic()
    with LocalBackend() as backend:
        for seed in seeds:
            plan = draw(seed, profile)
            seed_dir = workdir / f"seed-{seed}"
            seed_dir.mkdir(parents=True, exist_ok=True)
            (seed_dir / "plan.json").write_text(json.dumps(plan.to_json(), indent=1))
            print(f"seed {seed}: {plan.kcl_mode}, {plan.workers} workers, {len(plan.actions)} actions ...", flush=True)
            result = run_seed(plan, backend.endpoint, seed_dir)
            (seed_dir / "result.json").write_text(json.dumps(result.to_json(), indent=1))
            results.append(result)
            _write(args, results, command, time.monotonic() - started, len(seeds))  # survives an interrupted run
            verdict = "ok" if result.ok else "FAILED: " + "; ".join(result.failures)
            print(
                f"seed {seed}: {verdict} (events {result.events}, lost {result.lost}, duplicated {result.duplicated}, "
                f"caught up {result.caught_up_s} s, {result.total_s} s)",
                flush=True,
            )
    failed = [r.seed for r in results if not r.ok]
    print(f"{len(results)} seeds, {len(failed)} failed{': ' + str(failed) if failed else ''}; logs in {workdir}")
    return 1 if failed else 0


def _write(args: argparse.Namespace, results: list[SeedResult], command: str, elapsed: float, planned: int) -> None:
    """The report and the raw results so far (rewritten after each seed)."""
    if args.json_path:
        raw = {"command": command, "planned_seeds": planned, "results": [r.to_json() for r in results]}
        Path(args.json_path).write_text(json.dumps(raw, indent=1) + "\n")
    if args.report:
        Path(args.report).write_text(render(results, command, elapsed, planned))


if __name__ == "__main__":
    sys.exit(main())
