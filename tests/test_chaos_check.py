"""The chaos suite's independent check (copier.chaos.check) fails a seed for what it must: it can say no.

Each test writes a target stream by hand through the local backend, as a
faulty copier might have left it, and runs the check against a manifest.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from copier.chaos.check import Check, check
from copier.chaos.producer import Produced
from copier.config import load_config
from tests.conftest import Pipeline

MANIFEST = ["e1", "e2", "e3", "e4"]  # production order; keys below
KEYS = {"e1": "k", "e2": "j", "e3": "k", "e4": "k"}


def _judge(p: Pipeline, target: list[str], logs: Sequence[dict[str, object]] = (), **copier: object) -> Check:
    """Put ``target`` (event IDs, in this order) into the target stream, then check it against MANIFEST."""
    for event_id in target:
        data = json.dumps({"eventId": event_id}).encode()
        p.kinesis.put_record(StreamName=p.target, PartitionKey=KEYS[event_id], Data=data)
    log = p.tmp / "worker-1.log"
    log.write_text("".join(f"[stderr] {json.dumps(e)}\n" for e in logs))
    config = load_config(p.write_properties(**copier))
    return check(config, Produced(manifest=list(MANIFEST)), [log])


def test_a_clean_target_passes(pipeline: Pipeline) -> None:
    """Each event once, each key in production order: no failure."""
    verdict = _judge(pipeline, ["e1", "e2", "e3", "e4"])
    assert verdict.failures == [] and (verdict.lost, verdict.duplicated, verdict.out_of_order) == (0, 0, 0)


def test_a_lost_event_fails(pipeline: Pipeline) -> None:
    verdict = _judge(pipeline, ["e1", "e2", "e4"])
    assert verdict.lost == 1 and verdict.failures == ["lost 1: e3"]


def test_a_duplicate_the_copier_did_not_report_fails(pipeline: Pipeline) -> None:
    """An extra copy with no ``possible_duplicates`` report naming it fails the seed."""
    verdict = _judge(pipeline, ["e1", "e2", "e3", "e4", "e2"])
    assert verdict.duplicated == 1
    assert verdict.failures == ["duplicated 1 without a possible_duplicates report: ['e2']"]


def test_a_reported_late_copy_is_a_duplicate_not_an_order_violation(pipeline: Pipeline) -> None:
    """A zombie's late copy of e1 after e3 and e4: explained by the report, and the first copies kept order."""
    report = {"event": "possible_duplicates", "event_ids": ["e1"]}
    verdict = _judge(pipeline, ["e1", "e2", "e3", "e4", "e1"], logs=[report])
    assert verdict.failures == []
    assert (verdict.duplicated, verdict.explained_duplicates, verdict.out_of_order) == (1, 1, 0)


def test_a_key_out_of_order_fails_with_partition_key_ordering(pipeline: Pipeline) -> None:
    """e4 before e3 (same key k) breaks the order that copier.ordering = partitionKey promises."""
    verdict = _judge(pipeline, ["e1", "e2", "e4", "e3"])
    assert verdict.out_of_order == 1
    assert verdict.failures == ["1 events out of order per partition key: e3 after e4 (key k)"]


def test_out_of_order_is_only_counted_with_ordering_none(pipeline: Pipeline) -> None:
    verdict = _judge(pipeline, ["e1", "e2", "e4", "e3"], ordering="none")
    assert verdict.out_of_order == 1 and verdict.failures == []


def test_a_fatal_log_line_fails(pipeline: Pipeline) -> None:
    """Nothing in a chaos run should end a process: a ``fatal`` line in a worker's log fails the seed."""
    verdict = _judge(pipeline, ["e1", "e2", "e3", "e4"], logs=[{"event": "fatal", "error": "boom"}])
    assert verdict.failures == ["1 fatal errors in the copier's logs: boom"]
