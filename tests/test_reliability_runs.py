"""docs/reliability.md ends with every published chaos run's totals (scripts/reliability_runs.py), read from
the runs' own JSON: the moto seeds, the independent backend's and the shard-limits profile's side by side."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def test_the_published_report_ends_with_every_runs_totals() -> None:
    runs = load_script("reliability_runs")
    text = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    assert text.endswith("\n" + runs.section(ROOT / "docs")), "run scripts/reliability_runs.py (make chaos does)"
    for path in (ROOT / "docs").glob("reliability*.json"):
        assert f"[`{path.name}`]({path.name})" in text


def test_each_run_is_summed_from_its_json_and_a_rerun_replaces_the_section(tmp_path: Path) -> None:
    runs = load_script("reliability_runs")
    seed = {"ok": True, "events": 10, "lost": 0, "duplicated": 2, "explained_duplicates": 2, "backend": "independent"}
    failed = {**seed, "ok": False, "lost": 3, "events": 5}
    (tmp_path / "reliability.json").write_text(json.dumps({"code": "aaaa", "results": [{**seed, "backend": "moto"}]}))
    (tmp_path / "reliability-independent.json").write_text(
        json.dumps({"code": "bbbb", "planned_seeds": 20, "results": [seed, failed]})
    )
    shutil.copy(ROOT / "docs" / "reliability.md", tmp_path / "reliability.md")
    runs.rewrite(tmp_path)
    runs.rewrite(tmp_path)  # a second run replaces the section, never adds one
    text = (tmp_path / "reliability.md").read_text()
    assert text.count(runs.HEADING) == 1
    rows = [line for line in text.splitlines() if line.startswith("| [`")]
    assert rows[0].startswith("| [`reliability.json`]") and "| moto | `aaaa` | 1 | 0 | 10 | 0 | 2 | 2 |" in rows[0]
    assert "| independent | `bbbb` | 2 of 20 | 1 | 15 | 3 | 4 | 4 |" in rows[1]
