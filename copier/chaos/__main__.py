"""``python -m copier.chaos``: run chaos seeds on one local backend and write the report.

    python -m copier.chaos --seeds 50                 # seeds 1..50, the full profile (make chaos)
    python -m copier.chaos --seed 7 --seed 12         # chosen seeds
    python -m copier.chaos --profile smoke --seeds 2  # the short run of make test
    python -m copier.chaos --profile limits --seeds 5 # under Kinesis' per-shard limits (make chaos PROFILE=limits)
    python -m copier.chaos --seeds 50 --json R --resume  # go on with an interrupted run
    python -m copier.chaos --backend independent --seeds 20 # on kinesis-mock and dynalite (make chaos BACKEND=...)

Each seed's plan, results and worker logs go to ``--workdir/seed-N``; the
summary and the per-seed table go to ``--report`` (Markdown) and ``--json``.
Exit status 1 if any seed failed.

``--backend`` is ``copier local-backend --impl``'s choice: moto (the default) or the independent pair
(kinesis-mock and dynalite, ``copier.local.independent``), on which a seed leaves out what kinesis-mock
cannot serve (``copier.chaos.schedule.on_backend``); each result names its backend.

``--resume`` keeps the seeds that ``--json`` already holds and runs only the
others, when that file was written by the same code (a digest of the copier
package and of setup.cfg's pins, recorded in it) and the same profile: 50
seeds take longer than a working session on two cores, and a seed's
verdict does not depend on when it ran. Any other file is started over.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from copier.chaos.digest import code_digest
from copier.chaos.harness import worker_lease_ms
from copier.chaos.report import render
from copier.chaos.run import SeedResult, run_seed
from copier.chaos.schedule import PROFILES, draw, on_backend
from copier.local.independent import ENV_MARK, running


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m copier.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=0, help="run seeds 1..N")
    parser.add_argument("--seed", type=int, action="append", default=[], help="run this seed (repeatable)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--workdir", help="where each seed's logs go (default: a temporary directory)")
    parser.add_argument("--report", help="write the Markdown report here")
    parser.add_argument("--json", dest="json_path", help="write the raw results here")
    parser.add_argument("--resume", action="store_true", help="keep the seeds --json holds for this code")
    parser.add_argument(
        "--backend", choices=BACKENDS, default="moto", help="the local backend (copier local-backend --impl)"
    )
    args = parser.parse_args(argv)
    seeds = args.seed + list(range(1, args.seeds + 1))
    if not seeds:
        parser.error("give --seeds N or --seed S")
    from copier.local.backend import DUMMY_ENV

    for key, value in DUMMY_ENV.items():
        os.environ.setdefault(key, value)
    if args.backend == "independent":  # the workers' copier is told its state table has no TTL (dynalite)
        os.environ[ENV_MARK] = "independent"
    from copier.adapters.logs import configure_logging

    configure_logging("WARNING")
    profile = PROFILES[args.profile]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="copier-chaos-"))
    command = "python -m copier.chaos " + " ".join(argv if argv is not None else sys.argv[1:])
    code = code_digest()
    results, before = _resumed(args, code) if args.resume else ([], 0.0)
    done = {r.seed for r in results}
    if done:
        print(f"resuming: {len(done)} seeds already ran on this code ({sorted(done)})", flush=True)
    started = time.monotonic() - before
    lease_s = worker_lease_ms(args.backend) / 1000  # pauses shorter and longer than the lease the workers run with
    with running(args.backend, own_process=True) as backend:  # moto away from the proxy's and producer's threads
        for seed in [s for s in seeds if s not in done]:
            plan = on_backend(draw(seed, profile, lease_s=lease_s), backend.impl)
            seed_dir = workdir / f"seed-{seed}"
            seed_dir.mkdir(parents=True, exist_ok=True)
            (seed_dir / "plan.json").write_text(json.dumps(plan.to_json(), indent=1))
            print(f"seed {seed}: {plan.kcl_mode}, {plan.workers} workers, {len(plan.actions)} actions ...", flush=True)
            result = run_seed(plan, backend, seed_dir)
            (seed_dir / "result.json").write_text(json.dumps(result.to_json(), indent=1))
            results.append(result)
            _write(args, results, command, code, time.monotonic() - started, len(seeds))  # survives an interrupted run
            verdict = "ok" if result.ok else "FAILED: " + "; ".join(result.failures)
            print(
                f"seed {seed}: {verdict} (events {result.events}, lost {result.lost}, duplicated {result.duplicated}, "
                f"caught up {result.caught_up_s} s, {result.total_s} s)",
                flush=True,
            )
    _write(args, results, command, code, time.monotonic() - started, len(seeds))
    failed = [r.seed for r in results if not r.ok]
    print(f"{len(results)} seeds, {len(failed)} failed{': ' + str(failed) if failed else ''}; logs in {workdir}")
    return 1 if failed else 0


BACKENDS = ("moto", "independent")


def _resumed(args: argparse.Namespace, code: str) -> tuple[list[SeedResult], float]:
    """The results ``--json`` holds, if the same code and profile wrote them, and the time they took."""
    path = Path(args.json_path) if args.json_path else None
    if path is None or not path.is_file():
        return [], 0.0
    raw = json.loads(path.read_text())
    results = [SeedResult.from_json(r) for r in raw.get("results", [])]
    if raw.get("code") != code or any(r.profile != args.profile or r.backend != args.backend for r in results):
        print(f"not resuming: {path} was written by other code, profile or backend; starting over", flush=True)
        return [], 0.0
    return results, float(raw.get("elapsed_s", 0.0))


def _write(
    args: argparse.Namespace, results: list[SeedResult], command: str, code: str, elapsed: float, planned: int
) -> None:
    """The report and the raw results so far (rewritten after each seed)."""
    if args.json_path:
        raw = {
            "command": command,
            "code": code,
            "elapsed_s": round(elapsed, 1),
            "planned_seeds": planned,
            "results": [r.to_json() for r in results],
        }
        Path(args.json_path).write_text(json.dumps(raw, indent=1) + "\n")
    if args.report:
        Path(args.report).write_text(render(results, command, elapsed, planned, code, args.json_path or "not kept"))


if __name__ == "__main__":
    sys.exit(main())
