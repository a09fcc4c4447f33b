"""copier.adapters.logsplit: a line too long for journald and rsyslog is split into whole JSON lines."""

from __future__ import annotations

import io
import json

import structlog

from copier.adapters.logs import configure_logging
from copier.adapters.logsplit import LINE_LIMIT, SplitJSONRenderer


def test_a_short_line_is_left_alone() -> None:
    line = SplitJSONRenderer()(None, "error", {"event": "possible_duplicates", "event_ids": ["a", "b"]})
    assert json.loads(line) == {"event": "possible_duplicates", "event_ids": ["a", "b"]}


def test_a_long_id_list_is_split_into_parts_under_the_limit_each_naming_its_ids_once() -> None:
    """Ten thousand 36-character IDs: every line parses, fits, repeats the other fields, and the IDs add up."""
    ids = [f"{i:08d}-0000-4000-8000-000000000000" for i in range(10_000)]
    event = {"event": "possible_duplicates", "shard": "shardId-000000000001", "batch": 7, "event_ids": ids}
    lines = SplitJSONRenderer()(None, "error", dict(event)).split("\n")
    assert len(lines) > 1
    parsed = [json.loads(line) for line in lines]
    assert all(len(line.encode()) <= LINE_LIMIT for line in lines)
    assert [p["part"] for p in parsed] == list(range(1, len(lines) + 1))
    assert {p["parts"] for p in parsed} == {len(lines)}
    assert all(p["shard"] == "shardId-000000000001" and p["batch"] == 7 for p in parsed)
    assert [i for p in parsed for i in p["event_ids"]] == ids


def test_ids_and_digests_are_each_named_once_across_the_parts() -> None:
    """A report naming event IDs and records without an ID (their content digests): both lists are cut, each ID
    and each digest in exactly one part, every part carrying both fields (before, only the first list was cut
    and the digests were repeated whole in every part: a copy excused per part, and lines over the limit)."""
    ids = [f"id-{i:06d}" for i in range(300)]
    digests = [f"{i:020x}" for i in range(900)]
    event = {"event": "possible_duplicates", "batch": 3, "event_ids": ids, "unkeyed_digests": digests}
    lines = SplitJSONRenderer()(None, "error", dict(event)).split("\n")
    parsed = [json.loads(line) for line in lines]
    assert len(lines) > 1 and all(len(line.encode()) <= LINE_LIMIT for line in lines)
    assert all("event_ids" in p and "unkeyed_digests" in p and p["batch"] == 3 for p in parsed)
    assert [i for p in parsed for i in p["event_ids"]] == ids
    assert [d for p in parsed for d in p["unkeyed_digests"]] == digests


def test_the_logger_of_every_copier_process_splits() -> None:
    """configure_logging (copier process, run, scale-in-watch) ends in the splitting renderer."""
    out = io.StringIO()
    configure_logging("INFO", stream=out)
    try:
        structlog.get_logger("t").error("possible_duplicates", event_ids=[f"id-{i:06d}" for i in range(2000)])
    finally:
        structlog.reset_defaults()
    lines = out.getvalue().splitlines()
    assert len(lines) > 1 and all(len(line.encode()) <= LINE_LIMIT for line in lines)
    assert sum(len(json.loads(line)["event_ids"]) for line in lines) == 2000
