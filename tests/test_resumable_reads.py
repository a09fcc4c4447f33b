"""Long reads show how far they are and survive an interruption: the progress bar and lines
(copier.adapters.progress), shard files with a checkpoint a page (copier.adapters.shardfiles), and the commands on
them: copier export goes on where it stopped, copier verify --spool reads on from what it kept."""

from __future__ import annotations

import base64
import gzip
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from copier.adapters.progress import Progress
from copier.adapters.shardfiles import CHECKPOINT, ShardFiles
from copier.adapters.streamreader import StreamReader
from copier.commands.export import export_stream
from copier.commands.verify import run_verify
from copier.core.config import load_config
from copier.core.errors import ConfigError
from tests.conftest import Pipeline
from tests.test_verify import FakeKinesis, FakeTime, copier_passed_everything, events, put, resharded, verify

# -- progress -----------------------------------------------------------------------------------------------


def test_a_shards_part_done_comes_from_millis_behind_latest_and_never_goes_back() -> None:
    """A shard 8 s behind at its first page and 2 s behind now is three quarters done; a stream is the mean of its
    shards (those not started at 0); a page further behind than the last (records written faster than read) does
    not move it back; every shard done is 100 %."""
    progress = Progress(io.StringIO())
    progress.start("target", 2)
    progress.behind("target", "a", 8_000)
    progress.behind("target", "a", 2_000)
    assert progress.fraction("target") == pytest.approx(0.375)
    progress.behind("target", "a", 6_000)
    assert progress.fraction("target") == pytest.approx(0.375)
    progress.shard_done("target", "a")
    assert progress.fraction("target") == 0.5
    progress.behind("target", "b", 0)
    progress.shard_done("target", "b")
    assert progress.fraction("target") == 1.0


def test_a_terminal_gets_a_bar_redrawn_in_place_and_a_log_whole_lines() -> None:
    """On a terminal: one line rewritten with a carriage return (a bar, the percentage), ended by finish(); in a
    log: whole lines, each with the percentage, at most one an interval."""
    for terminal in (True, False):
        out, time_ = io.StringIO(), FakeTime()
        progress = Progress(out, clock=time_.clock, command="export", terminal=terminal)
        progress.start("target", 1)
        for behind in (10_000, 7_500, 5_000):
            time_.now += 3
            progress.records("target", 100)
            progress.behind("target", "s-0", behind)
        progress.finish()
        text = out.getvalue()
        if terminal:
            assert text.count("\n") == 1 and text.endswith("\n") and text.count("\r") >= 3
            last = text.rsplit("\r", 1)[1]
            assert last.startswith("export target [##########..........] 50%") and "300 records" in last
        else:
            lines = text.splitlines()
            assert "\r" not in text and len(lines) >= 3
            assert lines[-1] == "export: reading: target 300 records, 0/1 shards done, 50%"


# -- shard files and the reader ----------------------------------------------------------------------------


def _counting(fake: FakeKinesis, interrupt_at: int | None = None) -> list[int]:
    """Counts the records each GetRecords returns; with ``interrupt_at``, that call raises KeyboardInterrupt
    (an operator's Ctrl-C while the read waits for its answer)."""
    fetched: list[int] = []
    original = fake.get_records

    def get_records(ShardIterator: str, Limit: int) -> dict[str, Any]:  # noqa: N803 (boto3's names)
        if interrupt_at is not None and len(fetched) + 1 == interrupt_at:
            raise KeyboardInterrupt
        page = original(ShardIterator=ShardIterator, Limit=Limit)
        fetched.append(len(page["Records"]))
        return page

    fake.get_records = get_records  # type: ignore[method-assign]
    return fetched


def _reader(fake: FakeKinesis, files: ShardFiles | None) -> StreamReader:
    time_ = FakeTime()
    return StreamReader(fake, Progress(io.StringIO()), sleep=time_.sleep, clock=time_.clock, workers=1, files=files)


def _ids(reader: StreamReader) -> list[str]:
    return reader.read("s", "target", lambda _shard, r: str(r["PartitionKey"]))


EVERYTHING = ["a", "b", "c", "e", "f", "g", "h", "i", "d"]  # resharded(), parents first


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_a_read_interrupted_goes_on_after_the_last_page_kept(tmp_path: Path, compress: bool) -> None:
    """Ctrl-C at the fourth GetRecords: the pages before it are kept; run again on the same directory, the read
    gives every record once, in the same order as a read never interrupted, and fetches only what was not kept."""
    what = {"verify": ["s"]}
    first = resharded()
    _counting(first, interrupt_at=4)
    with pytest.raises(KeyboardInterrupt):
        _ids(_reader(first, ShardFiles(tmp_path, what, compress)))
    files = ShardFiles(tmp_path, what, compress)
    assert files.resumed
    kept = sum(files.open(f"target-{s}").lines for s in ("s-0", "s-1", "s-2", "s-3"))
    assert kept == 5, "three pages of two, the last cut: a, b, c (s-0 ended), e, f"
    second = resharded()
    fetched = _counting(second)
    assert _ids(_reader(second, ShardFiles(tmp_path, what, compress))) == EVERYTHING
    assert sum(fetched) == len(EVERYTHING) - kept, "nothing kept is fetched again"


def test_what_was_written_after_the_checkpoint_is_cut_off_and_read_again(tmp_path: Path) -> None:
    """A process killed while it wrote a page (its lines in the file, the checkpoint not yet moved): the next run
    cuts the file back to the checkpoint and reads that page again; nothing is doubled or torn."""
    what = {"verify": ["s"]}
    first = resharded()
    _counting(first, interrupt_at=4)
    with pytest.raises(KeyboardInterrupt):
        _ids(_reader(first, ShardFiles(tmp_path, what)))
    torn = tmp_path / "target-s-2.jsonl"
    with torn.open("a") as handle:
        handle.write('{"shardId": "s-2", "sequenceNumber": "s-2-2", "partitionKey": "g", "arrival": 0, "da')
    assert _ids(_reader(resharded(), ShardFiles(tmp_path, what))) == EVERYTHING
    assert [json.loads(line)["partitionKey"] for line in torn.open()] == ["e", "f", "g", "h", "i"]


def test_a_closed_shard_read_to_its_end_is_not_read_again_an_open_one_is_read_on(tmp_path: Path) -> None:
    """The next run on a complete directory fetches nothing from the closed parent and reads the open shards on
    from their last record: what arrived since is read, nothing twice."""
    what = {"verify": ["s"]}
    assert _ids(_reader(resharded(), ShardFiles(tmp_path, what))) == EVERYTHING
    later = resharded()
    later.records["s-1"].append("j")
    calls = _counting(later)
    assert _ids(_reader(later, ShardFiles(tmp_path, what))) == ["a", "b", "c", "e", "f", "g", "h", "i", "d", "j"]
    assert sum(calls) == 1 and ("GetRecords", "s-0") not in later.calls


def test_a_directory_another_read_left_is_refused(tmp_path: Path) -> None:
    """Resuming must not mix two reads: a checkpoint of another read (another stream, range, format) is refused
    with the directory named, before anything is written."""
    files = ShardFiles(tmp_path, {"export": "target", "since": None})
    files.open("target-s-0")
    files.append("target-s-0", [{"x": 1}], "1")
    with pytest.raises(ConfigError, match=str(tmp_path)):
        ShardFiles(tmp_path, {"export": "target", "since": 5})
    assert (tmp_path / CHECKPOINT).exists()


# -- copier export ------------------------------------------------------------------------------------------


def _exported(directory: Path) -> dict[str, list[dict[str, Any]]]:
    opener: Callable[[Path], Any] = lambda p: gzip.open(p, "rt") if p.suffix == ".gz" else p.open()  # noqa: E731
    return {p.name: [json.loads(line) for line in opener(p)] for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_an_export_interrupted_and_run_again_writes_what_one_never_interrupted_writes(
    tmp_path: Path, compress: bool
) -> None:
    """Ctrl-C twice (in the first shard, then in a later one), each time run again: the files, line for line and
    the order numbers across them, are those of an export never interrupted; the checkpoint goes at the end."""
    whole = tmp_path / "whole"
    export_stream(_reader(resharded(), None), "s", whole, compress, None, None)
    parts = tmp_path / "parts"
    for interrupt_at in (2, 3):
        fake = resharded()
        _counting(fake, interrupt_at)
        with pytest.raises(KeyboardInterrupt):
            export_stream(_reader(fake, None), "s", parts, compress, None, None)
        assert (parts / CHECKPOINT).exists()
    assert export_stream(_reader(resharded(), None), "s", parts, compress, None, None) == (9, 4)
    assert not (parts / CHECKPOINT).exists()
    assert _exported(parts) == _exported(whole)
    assert sorted(r["order"] for lines in _exported(parts).values() for r in lines) == list(range(9))


def test_an_export_of_a_relative_time_goes_on_with_the_times_its_first_run_resolved(tmp_path: Path) -> None:
    """``--since -1d`` names another instant at every run: run again after an interruption, the export goes on
    with the instant its first run resolved (kept in the checkpoint), not refused and not a mix of two ranges."""
    from copier.commands.export import Instant

    fake = resharded()
    _counting(fake, interrupt_at=3)
    with pytest.raises(KeyboardInterrupt):
        export_stream(_reader(fake, None), "s", tmp_path, False, Instant("-1d", 0), None)
    later = Instant("-1d", 10**15)  # a day before a later now: past every record's arrival (0 here)
    assert export_stream(_reader(resharded(), None), "s", tmp_path, False, later, None) == (9, 4)


class Interrupting:
    """A boto3 Kinesis client whose ``at``-th GetRecords raises KeyboardInterrupt (Ctrl-C while it waits)."""

    def __init__(self, kinesis: Any, at: int) -> None:
        self.kinesis, self.at, self.calls = kinesis, at, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kinesis, name)

    def get_records(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return dict(self.kinesis.get_records(**kwargs))


def test_an_export_interrupted_goes_on_against_the_local_backend(pipeline: Pipeline) -> None:
    """The real GetShardIterator AFTER_SEQUENCE_NUMBER: 30 records on 2 shards read 4 a page, interrupted at the
    third page and run again: each record exported once, numbered 0 to 29 in read order."""
    put(pipeline, pipeline.target, events(30))
    out = pipeline.tmp / "export"
    with pytest.raises(KeyboardInterrupt):
        interrupted = StreamReader(Interrupting(pipeline.kinesis, 3), Progress(io.StringIO()), page_records=4)
        export_stream(interrupted, pipeline.target, out, True, None, None)
    again = StreamReader(pipeline.kinesis, Progress(io.StringIO()), page_records=4)
    assert export_stream(again, pipeline.target, out, True, None, None)[0] == 30
    lines = [line for shard in _exported(out).values() for line in shard]
    assert sorted(json.loads(base64.b64decode(r["data"]))["eventId"] for r in lines) == sorted(events(30))
    assert [r["order"] for r in lines] == list(range(30))


# -- copier verify --spool ----------------------------------------------------------------------------------


def test_verify_interrupted_goes_on_from_its_spool_to_the_same_verdict(pipeline: Pipeline) -> None:
    """A verify interrupted while it reads (in process, as Ctrl-C would), then ``copier verify --spool`` on the
    same directory: the verdict of a verify never interrupted, from pages kept and pages read on; a third run,
    after more events, reads on for them."""
    put(pipeline, pipeline.staging, events(40) + ["e-3"])
    put(pipeline, pipeline.target, [e for e in events(40) if e != "e-9"])
    copier_passed_everything(pipeline)
    config = load_config(pipeline.properties)
    spool = pipeline.tmp / "spool"
    what = {"verify": [config.stream_name, config.target_stream_name, config.dead_letter_stream_name]}
    files = ShardFiles(spool, what)
    reader = StreamReader(Interrupting(pipeline.kinesis, 4), Progress(io.StringIO()), page_records=5, files=files)
    with pytest.raises(KeyboardInterrupt):
        run_verify(config, None, 5, reader)
    plain = verify(pipeline, "--json")
    resumed = verify(pipeline, "--json", "--spool", str(spool))
    assert (plain.returncode, resumed.returncode) == (1, 1), resumed.stderr
    assert json.loads(resumed.stdout) == json.loads(plain.stdout)
    assert json.loads(plain.stdout)["lost"] == 1
    put(pipeline, pipeline.target, ["e-9"])
    again = verify(pipeline, "--json", "--spool", str(spool))
    assert again.returncode == 0, again.stdout + again.stderr
    kept = [json.loads(line) for path in spool.glob("target-*.jsonl") for line in path.open()]
    assert len(kept) == 40, "the target's new record was read on and kept, nothing twice"


# -- copier audit ----------------------------------------------------------------------------------------------


def test_an_audit_in_a_log_says_its_running_stages_with_their_tasks() -> None:
    """Outside a terminal Spark's bar is off (tests/test_audit_job.py checks the real job's stderr) and a line
    names each stage running with its tasks done out of its total; no stage running: no line."""
    from collections import namedtuple

    from copier.spark.progress import StageLines, console_bar

    info = namedtuple("info", "name numTasks numCompletedTasks")

    class Tracker:
        stages: dict[int, Any] = {}

        def getActiveStageIds(self) -> list[int]:  # noqa: N802 (PySpark's names)
            return list(self.stages)

        def getStageInfo(self, stage_id: int) -> Any:  # noqa: N802
            return self.stages.get(stage_id)

    tracker = Tracker()
    lines = StageLines(tracker, io.StringIO())
    assert lines.line() is None and not console_bar(io.StringIO())
    tracker.stages = {7: info("count at audit.py:170", 48, 12), 5: info("collect at audit.py:201", 4, 4)}
    assert lines.line() == "audit: running: stage 5 (collect) 4/4; stage 7 (count) 12/48"
