"""``copier demo`` shows the takeover it promises: which worker took each of the killed worker's shards, when."""

from __future__ import annotations

import pytest

from copier.commands import demo


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
