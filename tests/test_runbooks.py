"""docs/operations.md holds the runbooks an operator looks for, and its troubleshooting index names only lines
copier writes and every exit status ``copier help exit-codes`` lists.

Seen (issue 45): no runbook for a restored or deleted state table, for moving one stuck shard's lease, for
telling a KCL-stuck lease from a copier-stuck one, for the KCL's own tables, and no index by log line or exit
code; ``copier status``'s problem lines pointed at a section ("A shard that does not move") that did not exist.
"""

from __future__ import annotations

import re
from pathlib import Path

from copier.commands.helptopics import EXIT_CODES

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = (ROOT / "docs/operations.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    """The text of one ``###`` section, up to the next heading."""
    start = OPERATIONS.index(f"\n### {title}\n")
    end = re.compile(r"\n##+ ").search(OPERATIONS, start + 1)
    return OPERATIONS[start : end.start() if end else len(OPERATIONS)]


def plain(title: str) -> str:
    """A section's title as a line quotes it: wrapped anywhere, with or without its backticks."""
    return " ".join(title.replace("`", "").split())


def copier_source() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "copier").rglob("*.py"))


def test_the_runbooks_an_operator_looks_for_are_there() -> None:
    for title in (
        "A shard that does not move",
        "Forcing one shard's lease to move",
        "The state table restored from a backup, or deleted",
        "The KCL's own tables: what may be deleted, and when",
        "Troubleshooting index",
    ):
        assert section(title).strip(), title
    kcl = section("The KCL's own tables: what may be deleted, and when")
    for table in ("lease table", "WorkerMetricStats", "CoordinatorState"):
        assert table in kcl, table
    headings = {plain(h) for h in re.findall(r"^##+ (.+)$", OPERATIONS, re.M)}
    for target in re.findall(r'"([^"]+)" (?:below|above)', OPERATIONS):  # every section a line points at exists
        assert plain(target) in headings, target


def test_the_index_names_only_lines_copier_writes_and_every_exit_status() -> None:
    index = section("Troubleshooting index")
    by_line, by_status = index.split("By exit status", 1)
    source = copier_source()
    events = [e for row in re.findall(r"^\| (`[^|]+) \|", by_line, re.M) for e in re.findall(r"`([a-z_]+)`", row)]
    assert len(events) >= 15, events
    unknown = [e for e in events if f'"{e}"' not in source]
    assert not unknown, f"the index names lines copier never writes: {unknown}"
    listed = set(re.findall(r"^\| (\d+(?:\+N)?) \|", by_status, re.M))
    statuses = set(re.findall(r"^  (\d+(?:\+N)?)  ", EXIT_CODES, re.M))
    assert statuses and listed == statuses, (listed, statuses)
