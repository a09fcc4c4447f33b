"""docs/reliability.md from the results of a chaos run: a summary, then a row a seed."""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Sequence

from copier.chaos.run import SeedResult

__all__ = ["render"]


def _faults(faults: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(faults.items())) or "-"


def render(
    results: Sequence[SeedResult], command: str, elapsed_s: float, planned: int | None = None, code: str = ""
) -> str:
    """The Markdown report (of the seeds run so far, when fewer than ``planned``); ``code``: the code digest."""
    total: Counter[str] = Counter()
    for r in results:
        total.update(r.faults)
    failed = [r for r in results if not r.ok]
    lines = [
        "# Reliability: the fault-injection suite",
        "",
        "Each seed runs the real pipeline (local backend, `copier run` workers with the KCL MultiLangDaemon,",
        "a producer of plain and KPL-aggregated records with duplicates and poison records) under the faults",
        "its seed draws, then checks the target and dead-letter streams against what was produced.",
        "What each fault is: `copier/chaos/schedule.py` and `copier/chaos/proxy.py`; the check:",
        "`copier/chaos/check.py`. A seed fails on a lost event, a duplicate the copier did not report",
        "(`possible_duplicates`), an event whose first copy is out of its key's order, a poison record not",
        "dead-lettered exactly once, a `fatal` log line, a crash loop, or a shard not caught up in time.",
        "",
        f"Command: `{command}` ({elapsed_s / 60:.0f} minutes on {platform.machine()}, "
        f"{platform.python_implementation()} {platform.python_version()}). Raw results: `docs/reliability.json`.",
        *(
            [f"Code digest `{code}` (the copier package and setup.cfg's pins; `copier/chaos/__main__.py`).", ""]
            if code
            else []
        ),
        "",
        "## Summary",
        "",
        *(
            [f"**In progress or interrupted: {len(results)} of {planned} seeds ran.**", ""]
            if planned is not None and len(results) < planned
            else []
        ),
        "| seeds | failed | events | events written | lost | duplicated | explained duplicates | out of order |",
        "|---|---|---|---|---|---|---|---|",
        f"| {len(results)} | {len(failed)} | {sum(r.events for r in results)} | "
        f"{sum(r.events_written for r in results)} | {sum(r.lost for r in results)} | "
        f"{sum(r.duplicated for r in results)} | {sum(r.explained_duplicates for r in results)} | "
        f"{sum(r.out_of_order for r in results)} |",
        "",
        f"KCL 3.x mode: {sum(1 for r in results if r.kcl_mode == '3.x')} seeds; "
        f"2.x-compatible mode: {sum(1 for r in results if r.kcl_mode == '2.x')} seeds. "
        f"Worker restarts: {sum(r.restarts for r in results)}; "
        f"unexpected daemon exits: {sum(r.unexpected_exits for r in results)}.",
        "",
        "Faults injected, by kind:",
        "",
        "| fault | count |",
        "|---|---|",
        *(f"| {kind} | {count} |" for kind, count in sorted(total.items())),
        "",
        "## Seeds",
        "",
        "| seed | mode | workers | events | staging records | aggregates (largest) | lost | duplicated | "
        "out of order | caught up (s) | time (s) | faults | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        verdict = "ok" if r.ok else "FAILED: " + "; ".join(r.failures)
        lines.append(
            f"| {r.seed} | {r.kcl_mode} | {r.workers} | {r.events} | {r.staging_records} | "
            f"{r.aggregates} ({r.largest_aggregate}) | {r.lost} | {r.duplicated} | {r.out_of_order} | "
            f"{r.caught_up_s if r.caught_up_s is not None else '-'} | {r.total_s} | {_faults(r.faults)} | {verdict} |"
        )
    return "\n".join(lines) + "\n"
