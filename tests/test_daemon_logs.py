"""The journal of a clean run through the real daemon: what an operator reading it sees (issue 23, "Logs").

Each processor line once, at its own level, with its shard (the daemon's
wrapped ERROR copy of every stderr line is gone); no ERROR at all in a clean
run; nothing at warning either (issue 45: ``journalctl -p warning`` shows
only what needs attention); a ``progress`` line per shard saying what was
forwarded; and after a graceful stop no ``lease_lost`` at INFO. The
worker's log file stands for the journal (``JOURNAL_STREAM`` names it), so
every line carries the priority journald files it at, and what
``journalctl -p warning`` would show of a clean run is checked too. The
lines an idle shard costs per minute are printed (run with ``-s``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from copier.local.backend import LocalBackend
from copier.local.pipeline import LocalPipeline
from copier.local.producer import produce

pytestmark = [pytest.mark.protocol, pytest.mark.timeout(420)]

IDLE_S = 30.0


def _priority(line: str) -> int:
    assert line.startswith("<") and line[2] == ">", f"a journal line without its priority: {line!r}"
    return int(line[1])


def _events(text: str) -> list[dict[str, object]]:
    out = []
    for line in (line[3:] for line in text.splitlines()):
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def test_a_clean_run_logs_each_line_once_no_error_and_its_progress(tmp_path: Path) -> None:
    with LocalBackend() as backend:
        pipeline = LocalPipeline(
            backend.endpoint,
            tmp_path,
            staging="staging-logs",
            target="target-logs",
            application="copier-logs",
            copier={"progressIntervalSeconds": "2"},
        )
        try:
            pipeline.create(staging_shards=2, target_shards=1)
            produced = produce(pipeline.kinesis, pipeline.staging, 400, run="logs", seed=5)
            worker = pipeline.start_worker("a", journal=True)
            assert pipeline.wait(lambda: pipeline.caught_up(produced.last), 180), f"not caught up; see {tmp_path}"
            before = len(worker.log_path.read_text().splitlines())
            time.sleep(IDLE_S)
            idle_lines = len(worker.log_path.read_text().splitlines()) - before
            per_minute = idle_lines * 60 / IDLE_S / 2
            print(f"idle: {idle_lines} lines in {IDLE_S:.0f} s for 2 shards: {per_minute:.1f} a shard a minute")
            assert pipeline.stop_workers([worker]) == [0], "a requested stop is a clean exit"
        finally:
            pipeline.stop_all()
    text = worker.log_path.read_text()
    lines = text.splitlines()
    by_priority = {line: _priority(line) for line in lines}
    attention = [line for line, priority in by_priority.items() if priority <= 4]
    print(f"journalctl -p warning of a clean run: {len(attention)} lines", *attention[:20], sep="\n")
    assert not [line for line, priority in by_priority.items() if priority <= 3], "nothing at error in a clean run"
    # issue 45: a clean start said the lease assignment's "Not able to assign all expiredOrUnAssignedLeases" and
    # clock_margin_widened / clock_bound ("fix the hosts' time sync") at warning, on one machine
    assert attention == [], "journalctl -p warning shows nothing of a clean run"
    assert not [line for line in lines if " ERROR " in line], "no daemon line at ERROR in a clean run"
    assert "Received error line from subprocess" not in text, "a processor line is not wrapped and repeated"
    events = _events(text)
    assert not [e for e in events if e.get("level") in ("error", "critical")], "no copier line at error"
    took_over = [e for e in events if e["event"] == "took_over"]
    assert sorted(e["shard"] for e in took_over) == ["shardId-000000000000", "shardId-000000000001"], took_over
    assert not [line for line, p in by_priority.items() if '"event": "took_over"' in line and p != 6], "at info"
    progress = [e for e in events if e["event"] == "progress"]
    assert progress and all(e["level"] == "info" and "shard" in e for e in progress)
    assert sum(int(e["forwarded_since"]) for e in progress) > 0, "progress says what was forwarded"  # type: ignore[call-overload]
    released = [n for n, e in enumerate(events) if e["event"] == "released"]
    assert released, "the graceful stop released the shards"
    assert not [e for e in events[released[0] :] if e["event"] == "lease_lost"], "no lease_lost at INFO after released"
    assert not [line for line in lines if " INFO " in line and "software.amazon.kinesis.leader" in line]
