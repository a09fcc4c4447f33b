"""docs/benchmarks-before-after.md sets every figure of docs/benchmarks.json beside the baseline's
(scripts/bench_before_after.py): the committed page is the script's output, and a figure only one run measured
says so instead of a number."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def test_the_published_page_is_the_scripts_output_of_the_published_runs() -> None:
    script = load_script("bench_before_after")
    text = (ROOT / "docs" / script.PAGE).read_text(encoding="utf-8")
    assert text == script.page(ROOT / "docs"), "run scripts/bench_before_after.py docs (make bench does)"
    assert json.loads((ROOT / "docs" / script.BEFORE).read_text())["source"] in text


def test_each_figure_is_read_from_both_runs_with_its_change(tmp_path: Path) -> None:
    script = load_script("bench_before_after")
    cell = {"payload_bytes": 200, "batch": 10, "ratio": 1.25, "copier_us_per_event": 30.0}
    before = {"source": "an old run", "cpu": [cell], "rolling": [{"restart": "new worker", "longest_pause_s": 20.0}]}
    after = {
        "method": {"command": "python -m copier.bench", "date": "2026-11-27", "code": "4328c4dc58913813"},
        "cpu": [{**cell, "ratio": 1.0, "copier_us_per_event": 24.0, "uncoalesced_ratio": 1.1}],
        "rolling": [{"restart": "new worker", "longest_pause_s": 5.0, "lost": 0}],
        "sources": {"redrive": {"write_units_per_event": 0.02}},
    }
    (tmp_path / script.BEFORE).write_text(json.dumps(before))
    (tmp_path / script.AFTER).write_text(json.dumps(after))
    script.rewrite(tmp_path)
    text = (tmp_path / script.PAGE).read_text()
    assert "- before: an old run" in text
    assert "- after: `python -m copier.bench` on 2026-11-27, code digest 4328c4dc58913813" in text
    assert "| 200 B, batches of 10: copier / plain | 1.25 | 1 | -20% |" in text
    assert "| 200 B, batches of 10: copier µs/event | 30 | 24 | -20% |" in text
    assert "| 200 B, batches of 10: coalescing off / plain | not measured | 1.1 |  |" in text
    assert "| new worker: longest pause of a shard, s | 20 | 5 | -75% |" in text
    assert "| new worker: lost | not measured | 0 |  |" in text
    assert "| redrive: write units per event | not measured | 0.02 |  |" in text
    assert "| repair: write units per event | not measured | not measured |  |" in text
