"""``copier demo`` shows the takeover it promises: which worker took each of the killed worker's shards, when."""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from copier.commands import demo
from copier.core.state import ShardState, shard_key
from copier.local import pipeline as pipeline_module
from copier.local.pipeline import LocalPipeline

_names = itertools.count(1)


class _Pipeline:
    """Owners as the state table would show them after a kill: nobody, then the survivors, one poll at a time."""

    def __init__(self) -> None:
        self.polls = [
            {"shardId-0": None, "shardId-3": None},
            {"shardId-0": "a", "shardId-3": None},
            {"shardId-0": "a", "shardId-3": "c"},
        ]

    def owners(self) -> dict[str, str | None]:
        return self.polls.pop(0) if len(self.polls) > 1 else self.polls[0]


def test_each_moved_shard_is_named_with_its_new_worker(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo.time, "sleep", lambda s: None)
    clock = demo._Clock()
    done = demo._show_takeovers(_Pipeline(), ["shardId-0", "shardId-3"], "b", clock.start, 60, clock, lambda: None)
    lines = capsys.readouterr().out.splitlines()
    assert done
    assert [line.split("] ")[1].split(",")[0] for line in lines] == [
        "shardId-0: taken over by worker a",
        "shardId-3: taken over by worker c",
    ]
    assert all("s after the kill" in line for line in lines)


def test_a_shard_never_taken_over_is_a_failure() -> None:
    class Nobody:
        def owners(self) -> dict[str, str | None]:
            return {"shardId-0": "b"}  # still the killed worker's (its processor never noticed)

    clock = demo._Clock()
    assert not demo._show_takeovers(Nobody(), ["shardId-0"], "b", clock.start - 100, 1, clock, lambda: None)


def test_the_kill_line_names_every_shard_the_killed_worker_held_or_was_moving() -> None:
    """Seen: progress `a:3 b:0, moving 1`, then the kill line named two shards of four (the other two were
    between owners at that reading) and their takeover was never reported. Every shard the kill concerns is
    named, and each is waited for until a live worker holds it."""
    owners = {"shardId-0": None, "shardId-1": "a", "shardId-2": "a", "shardId-3": None, "shardId-4": "b"}
    held, moving = demo.killed_shards(owners, "a")
    assert (held, moving) == (["shardId-1", "shardId-2"], ["shardId-0", "shardId-3"])
    assert demo.kill_line("a", held, moving) == (
        "SIGKILLed worker a (daemon and processors), owner of shardId-1, shardId-2; "
        "moving at the kill: shardId-0, shardId-3; starting c"
    )


def test_a_shard_not_seen_taken_over_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Nobody:
        def owners(self) -> dict[str, str | None]:
            return {"shardId-0": "c", "shardId-3": None}

    ticks = itertools.count(0, 20)
    monkeypatch.setattr(demo.time, "monotonic", lambda: float(next(ticks)))
    monkeypatch.setattr(demo.time, "sleep", lambda s: None)
    clock = demo._Clock()
    done = demo._show_takeovers(Nobody(), ["shardId-0", "shardId-3"], "a", clock.start, 60, clock, lambda: None)
    lines = [line.split("] ")[1] for line in capsys.readouterr().out.splitlines()]
    assert not done
    assert lines[0].startswith("shardId-0: taken over by worker c")
    assert lines[1].startswith("shardId-3: not seen taken over ")


def _summary(lines: list[str]) -> dict[str, str]:
    """The summary's rows by name: ``lost`` -> ``1``."""
    rows = lines[lines.index("summary") + 1 :]
    return {" ".join(row.split()[:-1]): row.split()[-1] for row in rows if row.startswith("  ")}


IDS = [f"evt-{i}" for i in range(5)]


@pytest.mark.protocol
@pytest.mark.parametrize(
    ("copied", "expected"),
    [(IDS, ("5", "0", "0", "OK")), ([*IDS[:-1], IDS[0]], ("5", "1", "1", "FAILED"))],
    ids=["exactly-once", "one-lost-one-twice"],
)
def test_the_summary_reads_what_copier_verify_found(
    endpoint: str, tmp_path: Path, copied: list[str], expected: tuple[str, ...]
) -> None:
    """Against copier verify's real output: the summary's target records, lost, duplicated and verdict are
    verify's (it printed ``lost ?`` and ``duplicated ?`` whatever verify said, once verify's text changed)."""
    n = next(_names)
    pipeline = LocalPipeline(
        endpoint, tmp_path, staging=f"demo-staging-{n}", target=f"demo-target-{n}", application=f"demo-summary-{n}"
    )
    pipeline.create(staging_shards=1, target_shards=1)
    for i in [*IDS, IDS[1]]:  # a producer duplicate in staging
        pipeline.kinesis.put_record(StreamName=pipeline.staging, Data=json.dumps({"eventId": i}), PartitionKey=i)
    for i in copied:
        pipeline.kinesis.put_record(StreamName=pipeline.target, Data=json.dumps({"eventId": i}), PartitionKey=i)
    ((shard_id, tip),) = pipeline.staging_tips().items()  # committed up to the tip: a missing event is lost
    pipeline.store.replace_if_unchanged(shard_key(pipeline.staging, shard_id), None, ShardState(epoch=1, position=tip))

    ok, lines = demo.verify_summary(pipeline, IDS, pipeline.staging_records(), time.monotonic())
    rows = _summary(lines)
    assert ok == (expected[-1] == "OK")
    assert (rows["unique events produced"], rows["staging records (with dups)"]) == ("5", "6")
    assert (rows["target records"], rows["lost"], rows["duplicated"], rows["verify"]) == expected


@dataclass
class _Worker:
    name: str
    alive: bool
    jvm_pid: int | None


def test_a_shard_between_owners_counts_for_no_worker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """While the KCL moves leases about, the shards each worker holds and those moving add up to all of them: a
    lease released (its processor not yet ended by the daemon) or with a successor announced is moving, not
    the old worker's (it was counted for the old worker, then for the new one too, or for nobody)."""
    held = 2**62  # a lease valid for ever
    states = {
        "shard-0": ShardState(epoch=1, owner="h:101:x", lease_until_ms=held),  # a's processor
        "shard-1": ShardState(epoch=2, owner="h:102:y", lease_until_ms=0),  # released, its processor still alive
        "shard-2": ShardState(epoch=3, owner="h:103:z", lease_until_ms=held, successor="h:201:s"),  # announced
        "shard-3": ShardState(epoch=1, owner="h:104:w", lease_until_ms=held),  # the killed worker b's
        "shard-4": ShardState(epoch=4, owner="h:201:s", lease_until_ms=held),  # c's processor
    }
    parents = {101: 11, 102: 11, 103: 11, 104: 12, 201: 13}
    monkeypatch.setattr(pipeline_module, "_parent_pid", parents.get)
    pipeline = LocalPipeline("http://127.0.0.1:9", tmp_path)
    monkeypatch.setattr(pipeline, "shard_states", lambda: states)
    pipeline.workers = [_Worker("a", True, 11), _Worker("b", False, None), _Worker("c", True, 13)]  # type: ignore[list-item]

    owners = pipeline.owners()
    assert owners == {"shard-0": "a", "shard-1": None, "shard-2": None, "shard-3": None, "shard-4": "c"}
    assert pipeline.shards_owned() == {"a": 1, "c": 1}
    line = demo.progress_line("writing", 700, [("a", True), ("b", False), ("c", True)], owners, 6, {"forwarded": 500})
    assert "staging holds 700 | shards a:1 b:down c:1, moving 3 (6 moves) | committed 500 forwarded" in line


def _argv(pid: int) -> list[str]:
    """A process's command line (empty once it has exited)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _descendants(pid: int) -> list[int]:
    children = pipeline_module.child_pids(pid)
    return children + [grandchild for child in children for grandchild in _descendants(child)]


@pytest.mark.protocol
@pytest.mark.timeout(300)
def test_a_killed_producers_spark_scratch_stays_in_the_workdir_and_goes_at_the_end(
    endpoint: str, tmp_path: Path
) -> None:
    """The demo SIGKILLs its Spark job, which then never removes its scratch files (spark-*, blockmgr-*,
    liblz4-java-*.so): each demo left them in /tmp. Spark's JVM is pointed at the pipeline's scratch directory,
    which stop_all removes."""
    n = next(_names)
    work = tmp_path / "work"
    pipeline = LocalPipeline(
        endpoint, work, staging=f"demo-staging-{n}", target=f"demo-target-{n}", application=f"demo-scratch-{n}"
    )
    pipeline.create(staging_shards=1, target_shards=1)
    demo.write_input(tmp_path / "input", 40_000)
    producer = pipeline.start_producer(
        tmp_path / "input", tmp_path / "checkpoint", "--id-column", "eventId", "--max-files-per-trigger", "1"
    )
    try:
        assert pipeline.wait(pipeline.staging_written, 240), (work / "producer.log").read_text()[-3000:]
        scratch = pipeline.spark_scratch
        jvms = [argv for argv in map(_argv, _descendants(producer.pid)) if argv and Path(argv[0]).name == "java"]
        assert jvms, "the Spark JVM is running"  # not the JVM's jspawnhelper (its path says java too)
        assert all(f"-Djava.io.tmpdir={scratch}" in argv for argv in jvms), jvms
        assert any(scratch.glob("blockmgr-*")), sorted(p.name for p in scratch.iterdir())
        pipeline.kill_producer(producer)
        assert any(scratch.iterdir()), "a SIGKILLed job leaves its scratch files"
    finally:
        pipeline.stop_all()
    assert not pipeline.spark_scratch.exists()
