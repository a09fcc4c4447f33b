"""``copier redrive`` through the real local backend and real processes: ``copier process`` dead-letters records
of every reason (no event ID under ``unkeyedPolicy = deadletter``, over the target's limit, a key Kinesis
refuses), then ``copier redrive`` sends them on, killed mid-put, run twice at once, run again with other
selections. Each time: the target holds each keyed event once, each record without an ID at least once with
every further copy named by a ``possible_duplicates`` report (``copier verify --reports`` OK), and the
dead-letter stream is left as it was."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Pipeline
from tests.support.backend import create_stream
from tests.support.deadletters import (
    SHARD,
    Command,
    DeadLettered,
    big_body,
    dead_letter_data,
    dead_lettered,
    raise_limit,
    reports_file,
    second_run_while_frozen,
    staged_recs,
    target_copies,
)

pytestmark = [pytest.mark.protocol, pytest.mark.timeout(300)]


def redrive(pipeline: Pipeline, *args: str) -> Command:
    return Command("redrive", "--properties", str(pipeline.properties), *args)


def verify(pipeline: Pipeline, reports: Path) -> Command:
    command = Command("verify", "--properties", str(pipeline.properties), "--reports", str(reports))
    command.finish()
    return command


def assert_each_once(pipeline: Pipeline, s: DeadLettered, *commands: Command) -> None:
    """Keyed events once each; every record without an ID at least once, copies beyond the first reported;
    the dead-letter stream untouched; copier verify agrees."""
    keyed, unkeyed = target_copies(pipeline.kinesis, pipeline.target)
    assert keyed == Counter(s.forwarded + s.oversize), keyed
    assert set(unkeyed) == set(s.unkeyed)
    assert dead_letter_data(pipeline.kinesis, s.dlq) == s.dead_letters, "the dead-letter stream is left as it was"
    check = verify(pipeline, reports_file(pipeline.tmp / "reports.jsonl", *commands))
    assert check.proc.returncode == 0 and "verify: OK" in check.out, check.out


@pytest.mark.parametrize("point,count", [("batch_recorded", 1), ("put_request", 1), ("put_request", 2)])
def test_a_redrive_killed_mid_put_and_run_again_sends_each_event_once(
    pipeline: Pipeline, processors: Any, point: str, count: int
) -> None:
    """SIGKILL once the chunk is recorded, or once the first or second of its three requests landed: the next run
    waits out the lease, verifies the chunk in flight in the target, and sends only what is missing."""
    s = dead_lettered(pipeline, processors, unkeyed=1200, big=3)
    raise_limit(pipeline.kinesis, pipeline.target)  # the cause fixed: the target takes the large events now
    first = redrive(pipeline)
    first.wait_for(point, count)
    first.kill()
    second = redrive(pipeline)
    assert second.finish() == 1, second.out  # the event under an empty key fails again
    verified = second.events("verified_pending")
    if verified:  # killed before its commit (a loaded machine may let it commit before the SIGKILL lands)
        assert verified[0]["landed"] >= (3 if point == "put_request" else 0), verified  # the large events
    assert "fails again: partition key is empty" in second.out and "bad-key-1" in second.out
    assert_each_once(pipeline, s, first, second)


def test_a_second_redrive_takes_the_shard_over_and_nothing_goes_twice(pipeline: Pipeline, processors: Any) -> None:
    """A run frozen mid-chunk while a second starts: the second announces itself and waits out the lease; the
    first, resumed, is fenced at its next write and says so; the second verifies its chunk and goes on."""
    s = dead_lettered(pipeline, processors, unkeyed=600, big=2, leaseMillis=8000)  # outlasts starting two commands
    raise_limit(pipeline.kinesis, pipeline.target)
    first = redrive(pipeline)
    second = second_run_while_frozen(first, pipeline.properties, "redrive", lambda: redrive(pipeline))
    assert first.finish() == 1 and "taken over by another redrive" in first.out, first.out
    assert second.finish() == 1, second.out  # the key that fails again
    assert first.events("fenced") and second.events("verified_pending")
    status = Command("status", "--properties", str(pipeline.properties))
    assert status.finish() == 0 and f"redrive {SHARD}: done" in status.out, status.out
    assert_each_once(pipeline, s, first, second)


def test_runs_with_other_selections_send_what_earlier_ones_did_not(pipeline: Pipeline, processors: Any) -> None:
    """A run selects by reason; an event over the target's limit fails again (left in the dead-letter stream,
    listed, exit 1) until the limit is raised; a dry run lists what would go and writes nothing; a later run
    without a selection sends the rest (the event dead-lettered twice once); a run after that sends nothing."""
    s = dead_lettered(pipeline, processors, unkeyed=20, big=2)
    only_unkeyed = redrive(pipeline, "--reason", "no_id")
    assert only_unkeyed.finish() == 0, only_unkeyed.out
    assert "sent 20 (no_id 20)" in only_unkeyed.out
    too_large = redrive(pipeline, "--reason", "oversize")
    assert too_large.finish() == 1
    assert too_large.out.count("fails again: a record of") == 3, too_large.out  # big-0 twice, big-1
    raise_limit(pipeline.kinesis, pipeline.target)
    before = target_copies(pipeline.kinesis, pipeline.target)
    dry = redrive(pipeline, "--dry-run")
    assert dry.finish() == 1, dry.out
    assert "would send 2 (oversize 2); sent before 21" in dry.out, dry.out  # 20, and big-0's second record
    assert "oversize: event big-0" in dry.out and "event bad-key-1 (key)" in dry.out
    assert target_copies(pipeline.kinesis, pipeline.target) == before, "a dry run puts nothing"
    rest = redrive(pipeline)
    assert rest.finish() == 1 and "sent 2 (oversize 2); sent before 21" in rest.out, rest.out
    again = redrive(pipeline, "--since", "0")
    assert again.finish() == 1 and "sent 0 (none)" in again.out, again.out
    keyed, unkeyed = target_copies(pipeline.kinesis, pipeline.target)
    assert sum(unkeyed.values()) == 20, "nothing was killed: records without an ID once each too"
    assert_each_once(pipeline, s, only_unkeyed, too_large, rest, again)


def test_the_live_copier_drops_a_later_staging_copy_of_a_redriven_event(pipeline: Pipeline, processors: Any) -> None:
    """The live window learnt the dead-lettered event's ID: a producer retry arriving within the window after the
    redrive is dropped as a duplicate, not forwarded a second time; the redrive itself was not stopped by it."""
    s = dead_lettered(pipeline, processors, unkeyed=2, big=1, window_s=600)
    raise_limit(pipeline.kinesis, pipeline.target)
    assert redrive(pipeline).finish() == 1  # the key that fails again
    kinesis, live = pipeline.kinesis, s.live
    assert live is not None
    kinesis.put_record(StreamName=pipeline.staging, PartitionKey="big-0", Data=big_body("big-0"))
    live.process(staged_recs(kinesis, pipeline.staging)[-1:])
    assert live.wait_for("committed")[-1]["duplicates"] == 1
    keyed, _ = target_copies(kinesis, pipeline.target)
    assert keyed["big-0"] == 1


def test_a_dead_letter_stream_that_ignores_partition_keys_is_refused_and_a_missing_one_is_a_config_error(
    pipeline: Pipeline,
) -> None:
    """Under AUTO two records of one event could be on two dead-letter shards, whose windows do not see each
    other: the redrive refuses to start (exit 4, naming the setting). No dead-letter stream configured: exit 2."""
    assert redrive(pipeline).finish() == 2
    dlq = f"{pipeline.staging}-dlq"
    create_stream(pipeline.kinesis, dlq, 1)
    pipeline.write_properties(deadLetterStreamName=dlq)
    arn = pipeline.kinesis.describe_stream_summary(StreamName=dlq)["StreamDescriptionSummary"]["StreamARN"]
    pipeline.kinesis.update_stream_record_distribution_strategy(StreamARN=arn, RecordDistributionStrategy="AUTO")
    refused = redrive(pipeline)
    assert refused.finish() == 4
    assert any("RecordDistributionStrategy AUTO" in line for line in refused.lines), refused.lines


def test_a_redrive_interrupted_stops_after_its_chunk_releases_and_the_next_run_goes_on(
    pipeline: Pipeline, processors: Any
) -> None:
    """Ctrl-C (SIGINT) while a chunk is being put: the run finishes that chunk, releases its shard (the next run
    need not wait out a lease) and exits 130; run again, it sends nothing twice."""
    s = dead_lettered(pipeline, processors, unkeyed=600, big=1)
    raise_limit(pipeline.kinesis, pipeline.target)
    first = redrive(pipeline)
    first.wait_for("batch_recorded")
    first.proc.send_signal(signal.SIGINT)
    assert first.finish() == 130 and "INTERRUPTED" in first.out, first.out
    assert first.events("committed") and first.events("released")
    second = redrive(pipeline)
    assert second.finish() == 1, second.out  # the key that fails again
    assert not second.events("waiting_for_lease") and not second.events("verified_pending")
    assert_each_once(pipeline, s, first, second)
