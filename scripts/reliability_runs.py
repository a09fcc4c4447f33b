"""Every published chaos run, one line each, at the end of docs/reliability.md.

`make chaos` writes one report per profile and backend (docs/reliability.md for
the full profile on moto, docs/reliability-<profile>[-<backend>].md for the
others: copier.chaos never starts one run's results over with another's). This
puts them side by side in docs/reliability.md, read from their JSON, so the
moto seeds, the seeds on kinesis-mock and dynalite and the shard-limits profile
are read in one place with the code digest each ran on. It lives outside the
copier package on purpose: the digest is of the code the seeds run, and this
only reads their results. `make chaos` runs it after every run; the tests
check docs/reliability.md ends with its output.

Usage: python scripts/reliability_runs.py [DOCS_DIR]   (rewrites DOCS_DIR/reliability.md)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HEADING = "## Every published run"
SUMS = ("events", "lost", "duplicated", "explained_duplicates", "changed", "out_of_order", "unexpected_exits")


def _run(path: Path) -> dict[str, Any]:
    raw = json.loads(path.read_text(encoding="utf-8"))
    results = raw.get("results", [])
    backends = sorted({r.get("backend", "moto") for r in results}) or ["-"]
    profiles = sorted({r.get("profile", "full") for r in results}) or ["-"]
    return {
        "file": path.name,
        "profile": ", ".join(profiles),
        "backend": ", ".join(backends),
        "code": raw.get("code", "") or "-",
        "seeds": len(results),
        "planned": raw.get("planned_seeds"),
        "failed": sum(1 for r in results if not r.get("ok")),
        **{key: sum(int(r.get(key, 0) or 0) for r in results) for key in SUMS},
    }


def section(docs: Path) -> str:
    """The section: one row per docs/reliability*.json, the full moto run first."""
    files = sorted(docs.glob("reliability*.json"), key=lambda p: (p.name != "reliability.json", p.name))
    lines = [
        HEADING,
        "",
        "Every run whose results are in `docs/` (each file's own report beside it: the `.md` of the same name),",
        "summed from its JSON by `scripts/reliability_runs.py`. A run on other code than another's has another",
        "code digest.",
        "",
        "| results | profile | backend | code digest | seeds | failed | events | lost | duplicated IDs | "
        "explained copies | changed | out of order | unexpected exits |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path in files:
        r = _run(path)
        seeds = f"{r['seeds']}" + (f" of {r['planned']}" if r["planned"] and r["planned"] > r["seeds"] else "")
        lines.append(
            f"| [`{r['file']}`]({r['file']}) | {r['profile']} | {r['backend']} | `{r['code']}` | {seeds} | "
            f"{r['failed']} | {r['events']} | {r['lost']} | {r['duplicated']} | {r['explained_duplicates']} | "
            f"{r['changed']} | {r['out_of_order']} | {r['unexpected_exits']} |"
        )
    return "\n".join(lines) + "\n"


def rewrite(docs: Path) -> None:
    """Replace (or add) the section at the end of ``docs``/reliability.md."""
    report = docs / "reliability.md"
    text = report.read_text(encoding="utf-8")
    if HEADING in text:
        text = text[: text.index(HEADING)].rstrip("\n") + "\n"
    report.write_text(text + "\n" + section(docs), encoding="utf-8")


if __name__ == "__main__":
    rewrite(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "docs")
