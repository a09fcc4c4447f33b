"""Kinesis as it is now: streams that ignore partition keys (RecordDistributionStrategy AUTO), records up to 10 MiB,
and the settings copier reads from DescribeStreamSummary (copier.core.streamsettings, and what copier.shard does)."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from copier.core.errors import AmbiguousPutError, TransientAwsError
from copier.core.limits import MAX_RECORD_BYTES
from copier.core.plan import SourceRecord
from copier.core.shardmap import hash_key
from copier.core.state import ShardState, shard_key
from copier.core.streamsettings import (
    AUTO,
    PARTITION_KEY,
    SUMMARY_MAX_AGE_S,
    SUMMARY_RETRY_S,
    StreamSettings,
    blocking,
    judge,
)
from copier.local.backend import DUMMY_ENV
from tests.conftest import Pipeline
from tests.support.fakes import SHARD, SimulatedCrash, World, config
from tests.support.model import keyed_event

COPIER = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "copier")

MINUTE = 60_000
HOUR_MS = 3_600_000


def ids(world: World, stream: str = "target") -> Counter[str]:
    return Counter(json.loads(d)["eventId"] for d in world.streams.data(stream) if d.startswith(b'{"eventId'))


# -- reading the settings ---------------------------------------------------------------------------


def test_a_summary_gives_every_setting_and_an_older_answer_the_defaults() -> None:
    summary = {
        "RetentionPeriodHours": 48,
        "MaxRecordSizeInKiB": 10240,
        "RecordDistributionStrategy": "AUTO",
        "EncryptionType": "KMS",
        "KeyId": "alias/k",
        "StreamModeDetails": {"StreamMode": "ON_DEMAND"},
        "OpenShardCount": 4,
    }
    s = StreamSettings.from_summary("t", summary)
    assert (s.retention_ms, s.max_record_bytes, s.auto, s.encryption, s.key_id, s.mode, s.open_shards) == (
        48 * HOUR_MS,
        10 * 1024 * 1024,
        True,
        "KMS",
        "alias/k",
        "ON_DEMAND",
        4,
    )
    old = StreamSettings.from_summary("t", {"RetentionPeriodHours": 24})
    assert (old.max_record_bytes, old.distribution, old.encryption) == (MAX_RECORD_BYTES, PARTITION_KEY, "NONE")


def test_the_verdicts_name_each_setting_and_what_copier_does_under_it() -> None:
    staging = StreamSettings("s", 24 * HOUR_MS, 4 * MAX_RECORD_BYTES, AUTO)
    target = StreamSettings("t", 168 * HOUR_MS, MAX_RECORD_BYTES, AUTO, open_shards=8)
    lines = judge(staging, target, None, ordering="partitionKey", window_ms=HOUR_MS, digest_ttl_floor_ms=48 * HOUR_MS)
    errors = [v.text for v in lines if v.level == "error"]
    assert any("staging s has RecordDistributionStrategy AUTO" in e for e in errors)
    assert any("no order per partition key" in e for e in errors)
    assert any("records over 1048576 bytes" in e and "stall" in e for e in errors)
    assert any("digest batches live up to 48 h" in v.text for v in lines)
    assert any("owner gap of up to 168 h" in v.text for v in lines)
    calm = judge(
        StreamSettings("s", 24 * HOUR_MS),
        StreamSettings("t", 24 * HOUR_MS, distribution=AUTO, open_shards=8),
        StreamSettings("d", 24 * HOUR_MS),
        ordering="none",
        window_ms=HOUR_MS,
        digest_ttl_floor_ms=48 * HOUR_MS,
    )
    assert [v.level for v in calm if v.level != "ok"] == ["warning"]
    assert "reads 8 open shards" in next(v.text for v in calm if v.level == "warning")


def test_one_open_shard_is_said_in_the_singular() -> None:
    """Seen: `1 open shards` in check-config's line about a stream."""
    one = judge(
        StreamSettings("s", 24 * HOUR_MS, open_shards=1),
        StreamSettings("t", 24 * HOUR_MS, distribution=AUTO, open_shards=1),
        None,
        ordering="none",
        window_ms=HOUR_MS,
        digest_ttl_floor_ms=48 * HOUR_MS,
    )
    texts = " | ".join(v.text for v in one)
    assert "1 open shards" not in texts and "staging s: " in texts and ", 1 open shard, " in texts, texts
    assert "reads 1 open shard of it" in texts, texts


def test_blocking_is_staging_auto_or_an_ordered_auto_target() -> None:
    assert blocking(StreamSettings("s", distribution=AUTO), None, "none") is not None
    assert blocking(None, StreamSettings("t", distribution=AUTO), "partitionKey") is not None
    assert blocking(None, StreamSettings("t", distribution=AUTO), "none") is None
    assert blocking(None, None, "partitionKey") is None


# -- a target that ignores keys ----------------------------------------------------------------------


def one_shard_events(world: World, n: int) -> list:  # type: ignore[type-arg]
    """``n`` events whose keys all hash to the target's first shard (a verification bound to one shard)."""
    low, high, _ = world.streams.shard_map("target").ranges[0]
    keys = [k for k in (f"k{i}" for i in range(2000)) if low <= hash_key(k) <= high][:n]
    now = world.clock.now_ms()
    return [keyed_event(i, f"e{i}", now, pk=k) for i, k in enumerate(keys, 1)]


def test_an_ambiguous_put_to_a_target_that_ignores_keys_is_found_in_the_other_shards() -> None:
    """The target is AUTO (copier.ordering = none): entries land on shards their keys do not hash to, the
    answer is lost; verification finds them in every shard and sends nothing again."""
    world = World(config(ordering="none"), target_shards=3)
    world.streams.auto.add("target")
    calls = []

    def lose_first_answer(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], Exception | None]:
        calls.append(stream)
        error = AmbiguousPutError("PutRecords", "ReadTimeout", "lost") if len(calls) == 1 else None
        return [True] * len(entries), error

    world.streams.fault = lose_first_answer  # type: ignore[assignment]
    world.worker().process(one_shard_events(world, 6))
    assert ids(world) == Counter({f"e{i}": 1 for i in range(1, 7)})
    assert [r.shards_read for r in world.streams.reads] == [1, 3]


def test_a_successor_finds_a_chunk_in_flight_in_any_shard_of_a_target_that_ignores_keys() -> None:
    world = World(config(ordering="none"), target_shards=3)
    world.streams.auto.add("target")
    records = one_shard_events(world, 6)
    world.streams.fault = lambda s, e: ([True] * len(e), SimulatedCrash("mid put"))
    with pytest.raises(SimulatedCrash):
        world.worker().process(records)
    world.streams.fault = lambda s, e: ([True] * len(e), None)
    world.clock.advance(MINUTE)
    world.worker().process(records)
    assert ids(world) == Counter({f"e{i}": 1 for i in range(1, 7)})


def test_an_ordered_copier_stops_while_the_target_ignores_keys_and_goes_on_after() -> None:
    """copier.ordering = partitionKey and a target switched to AUTO: nothing is put while it is; an error
    says why; once it is USER_PARTITION_KEY again, everything goes, once."""
    world = World(target_shards=2)
    world.streams.auto.add("target")
    worker = world.worker()
    sleeps: list[int] = []
    real_sleep = world.clock.sleep_ms

    items: list[ShardState | None] = []  # the state item while blocked, as copier status reads it
    began = world.clock.now_ms()

    def switch_back_after_two(ms: int) -> None:
        sleeps.append(ms)
        items.append(world.store.get(shard_key("staging", SHARD)))
        if len(sleeps) == 2:
            world.streams.auto.discard("target")
        real_sleep(ms)

    world.clock.sleep_ms = switch_back_after_two  # type: ignore[method-assign]
    with capture_logs() as logs:
        worker.process([keyed_event(1, "a", world.clock.now_ms())])
    blocks = [e for e in logs if e["event"] == "stream_settings_block"]
    assert len(blocks) == 2 and "keeps no order" in blocks[0]["detail"]
    assert ids(world) == Counter({"a": 1})
    for item in items:  # the stall in the state item from the first look, with the time it began
        assert item is not None and (item.stall_reason, item.stall_since_ms) == ("stream_settings", began)
        assert "keeps no order" in item.stall_detail
    after = world.store.get(shard_key("staging", SHARD))
    assert after is not None and after.stall_reason is None, "forwarding again: the commit clears it"


def _auto_for(stream: str, ms: int) -> tuple[World, int]:
    """A world whose settings are cached as the real adapter caches them, ``stream`` ignoring keys for ``ms``
    from now (the start, returned)."""
    world = World(target_shards=2)
    world.streams.cache_settings = True
    start = world.clock.now_ms()
    world.streams.auto.add(stream)
    world.streams.auto_until[stream] = start + ms
    return world, start


def test_a_blocked_copier_sees_the_target_switched_back_within_the_retry_interval_not_the_cache_age() -> None:
    """The settings cached as the real adapter caches them (a forwarding processor asks DescribeStreamSummary
    every SUMMARY_MAX_AGE_S): a processor that read the target as AUTO and stopped asks again after
    SUMMARY_RETRY_S, so a target switched back 20 s later is forwarded to again within that and a backoff,
    not 5 minutes later. (Chaos smoke seed 8: a processor that started during a target AUTO switch stalled its
    shard, and the children waiting on it, past the run's 240 s.)"""
    world, start = _auto_for("target", 20_000)
    worker = world.worker()
    with capture_logs() as logs:
        worker.process([keyed_event(1, "a", start)])
    assert ids(world) == Counter({"a": 1})
    assert [e["event"] for e in logs if e["event"].startswith("stream_settings")][-1] == "stream_settings_ok"
    waited = world.clock.now_ms() - (start + 20_000)
    assert 0 < waited <= SUMMARY_RETRY_S * 1000 + world.config.max_backoff_millis, waited
    assert SUMMARY_RETRY_S * 1000 + world.config.max_backoff_millis < SUMMARY_MAX_AGE_S * 1000 - 20_000


def test_a_blocked_copier_asks_again_only_for_the_stream_that_blocks_it() -> None:
    """DescribeStreamSummary's 20 calls a second are the account's, shared by every shard: a processor stopped by
    a staging stream ignoring keys for 3 minutes asks for staging about every SUMMARY_RETRY_S and for the
    target only once (its first answer stays good for SUMMARY_MAX_AGE_S)."""
    world, start = _auto_for("staging", 180_000)
    worker = world.worker()
    world.streams.described.clear()
    worker.process([keyed_event(1, "a", start)])
    assert ids(world) == Counter({"a": 1})
    assert world.streams.described.get("target", 0) <= 1
    assert 180 / SUMMARY_RETRY_S <= world.streams.described["staging"] <= 180 / SUMMARY_RETRY_S + 2


def test_the_cached_settings_of_the_in_memory_streams_age_as_the_real_adapters_do() -> None:
    """What the test above relies on: a switch is not seen within SUMMARY_MAX_AGE_S without ``refresh``, and is
    seen after SUMMARY_RETRY_S with it."""
    world = World()
    streams = world.streams
    streams.cache_settings = True
    assert streams.settings("target").distribution == PARTITION_KEY
    streams.auto.add("target")
    world.clock.sleep_ms(int(SUMMARY_RETRY_S * 1000) + 1)
    assert streams.settings("target").distribution == PARTITION_KEY, "cached for SUMMARY_MAX_AGE_S"
    assert streams.settings("target", refresh=True).distribution == AUTO
    streams.auto.discard("target")
    world.clock.sleep_ms(int(SUMMARY_MAX_AGE_S * 1000) + 1)
    assert streams.settings("target").distribution == PARTITION_KEY


# -- a staging stream that ignores keys --------------------------------------------------------------


def _outside(shard_range: tuple[int, int], n: int) -> list[str]:
    low, high = shard_range
    return [k for k in (f"k{i}" for i in range(1000)) if not low <= hash_key(k) <= high][:n]


def test_a_staging_stream_that_ignores_keys_stops_forwarding_and_what_came_meanwhile_is_reported() -> None:
    """Records arrive whose keys this shard's range does not hold: copier asks for the staging settings at
    once, finds AUTO, stops (an error naming the setting), keeps its lease; once PARTITION_KEY is back it
    forwards them, each reported as a possible duplicate before its put (a copy may be on another shard)."""
    world = World()
    world.streams.shard_counts["staging"] = 2
    worker = world.worker()
    own = worker.guard.own_range()
    assert own is not None
    keys = _outside(own, 2)
    world.streams.auto.add("staging")
    real_sleep = world.clock.sleep_ms
    sleeps: list[int] = []

    def switch_back(ms: int) -> None:
        sleeps.append(ms)
        world.streams.auto.discard("staging")
        real_sleep(ms)

    world.clock.sleep_ms = switch_back  # type: ignore[method-assign]
    now = world.clock.now_ms()
    records = [keyed_event(1, "a", now, pk=keys[0]), keyed_event(2, "b", now, pk=keys[1])]
    with capture_logs() as logs:
        worker.process(records)
    names = [e["event"] for e in logs]
    assert names.index("stream_settings_block") < names.index("possible_duplicates")
    assert "RecordDistributionStrategy AUTO" in next(e["detail"] for e in logs if e["event"] == "stream_settings_block")
    report = next(e for e in logs if e["event"] == "possible_duplicates")
    assert sorted(report["event_ids"]) == ["a", "b"]
    assert ids(world) == Counter({"a": 1, "b": 1})
    state = world.store.get(worker.key)
    assert state is not None and "auto_seen_ms" in state.counters


def test_records_within_the_shards_range_are_forwarded_without_a_report() -> None:
    world = World()
    world.streams.shard_counts["staging"] = 2
    worker = world.worker()
    own = worker.guard.own_range()
    assert own is not None
    inside = [k for k in (f"k{i}" for i in range(1000)) if own[0] <= hash_key(k) <= own[1]][:2]
    with capture_logs() as logs:
        worker.process([keyed_event(1, "a", world.clock.now_ms(), pk=inside[0])])
    assert not [e for e in logs if e["event"] in ("possible_duplicates", "stream_settings_block")]
    assert ids(world) == Counter({"a": 1})


# -- record limits -----------------------------------------------------------------------------------


def test_a_record_the_target_takes_is_forwarded_whatever_its_size_and_a_larger_one_dead_lettered() -> None:
    """Target raised to 10 MiB: an 8 MiB record goes to the target; over the target's limit it goes to the
    dead-letter stream, whose envelope keeps its SHA-256 when the dead-letter stream's limit is smaller."""
    world = World(config(deadLetterStreamName="dlq"))
    world.streams.max_record_bytes.update({"target": 10 * 1024 * 1024, "staging": 10 * 1024 * 1024})
    now = world.clock.now_ms()
    eight = keyed_event(1, "big", now, size=8 * 1024 * 1024)
    over = keyed_event(2, "huge", now, size=10 * 1024 * 1024)
    world.worker().process([eight, over])
    assert ids(world) == Counter({"big": 1})
    (envelope,) = [json.loads(d) for d in world.streams.data("dlq")]
    assert envelope["dataTruncated"] is True and "exceeds the target's limit of 10485760 bytes" in envelope["reason"]


# -- check-config against streams set up each way --------------------------------------------------


def _check_config(p: Pipeline, **copier: object) -> subprocess.CompletedProcess[str]:
    props = p.write_properties(**copier)
    return subprocess.run(
        [COPIER, "check-config", str(props)],
        capture_output=True,
        text=True,
        env={**os.environ, **DUMMY_ENV},
        timeout=60,
    )


def test_check_config_reports_each_streams_settings_and_refuses_a_staging_stream_that_ignores_keys(
    pipeline: Pipeline,
) -> None:
    p = pipeline
    plain = _check_config(p)
    assert plain.returncode == 0, plain.stderr
    assert f"staging {p.staging}: " in plain.stdout and "RecordDistributionStrategy USER_PARTITION_KEY" in plain.stdout
    assert "MaxRecordSize 1 MiB, retention 24 h" in plain.stdout and "digest batches live up to 48 h" in plain.stdout

    def arn(stream: str) -> str:
        return str(p.kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"])

    p.kinesis.update_max_record_size(StreamARN=arn(p.staging), MaxRecordSizeInKiB=4096)
    larger = _check_config(p)
    assert larger.returncode == 4, "no dead-letter stream: records the target refuses would stall their shard"
    assert "records over 1048576 bytes (key included) stall their shard" in larger.stderr
    p.kinesis.update_max_record_size(StreamARN=arn(p.target), MaxRecordSizeInKiB=4096)
    p.kinesis.update_stream_record_distribution_strategy(StreamARN=arn(p.target), RecordDistributionStrategy="AUTO")
    ordered = _check_config(p)
    assert ordered.returncode == 4 and "keeps no order per partition key" in ordered.stderr
    unordered = _check_config(p, ordering="none")
    assert unordered.returncode == 0 and "warning: " in unordered.stderr and "open shards of it" in unordered.stderr
    p.kinesis.update_stream_record_distribution_strategy(StreamARN=arn(p.staging), RecordDistributionStrategy="AUTO")
    auto = _check_config(p, ordering="none")
    assert auto.returncode == 4
    assert f"error: staging {p.staging} has RecordDistributionStrategy AUTO" in auto.stderr
    p.init()
    status = subprocess.run(
        [COPIER, "status", "--properties", str(p.properties)],
        capture_output=True,
        text=True,
        env={**os.environ, **DUMMY_ENV},
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    assert f"{p.staging}: RecordDistributionStrategy AUTO, MaxRecordSize 4096 KiB" in status.stdout
    assert f"{p.target}: RecordDistributionStrategy AUTO, MaxRecordSize 4096 KiB" in status.stdout


def _one_copy_on_each_staging_shard(world: World) -> tuple[SourceRecord, str]:
    """Event E with a key of shard 1's range: its copy on shard 0 was put there while staging ignored keys."""
    ranges = world.streams.current_map("staging").ranges
    low, high = next((lo, hi) for lo, hi, sid in ranges if sid == "shardId-000000000001")
    key = next(k for k in (f"k{i}" for i in range(1000)) if low <= hash_key(k) <= high)
    return keyed_event(1, "E", world.clock.now_ms(), pk=key), key


def test_a_stray_copy_on_a_staging_shard_closed_since_is_still_reported() -> None:
    """Staging back to USER_PARTITION_KEY and shard 0 split before its processor reaches the stray copy of E:
    the shard's range still comes from ListShards (a closed shard keeps it), so the copy is reported (it was
    taken from the map of open shards, found nothing, and E landed twice unreported; a review found it)."""
    world = World()
    world.streams.shard_counts["staging"] = 2
    event, _ = _one_copy_on_each_staging_shard(world)
    world.streams.split("staging", "shardId-000000000000")
    with capture_logs() as logs:
        world.worker("shardId-000000000000").process([event])
        world.worker("shardId-000000000001").process([event])
    assert [e["event_ids"] for e in logs if e["event"] == "possible_duplicates"] == [["E"]]


def test_a_throttled_listshards_does_not_hide_a_stray_copy() -> None:
    """The range lookup is throttled once on the owner's first chunk: retried, not taken as 'no range'."""
    world = World()
    world.streams.shard_counts["staging"] = 2
    event, _ = _one_copy_on_each_staging_shard(world)
    real = world.streams.shards
    calls = {"n": 0}

    def throttled_once(stream: str) -> list[dict[str, object]]:
        calls["n"] += 1
        if stream == "staging" and calls["n"] == 1:
            raise TransientAwsError("ListShards", "LimitExceededException", "slow down")
        return real(stream)

    world.streams.shards = throttled_once  # type: ignore[method-assign, assignment]
    with capture_logs() as logs:
        world.worker("shardId-000000000000").process([event])
    assert [e["event_ids"] for e in logs if e["event"] == "possible_duplicates"] == [["E"]]


def test_check_config_warns_when_the_dead_letter_stream_keeps_records_shorter_than_staging() -> None:
    """A dead-lettered event can be redriven only while the dead-letter stream keeps it: a retention shorter than
    staging's is a warning (and staging's or longer none)."""
    staging = StreamSettings("s", 168 * HOUR_MS)

    def warned(dead_letter_hours: int) -> list[str]:
        verdicts = judge(
            staging,
            StreamSettings("t", 24 * HOUR_MS),
            StreamSettings("d", dead_letter_hours * HOUR_MS),
            ordering="partitionKey",
            window_ms=3_600_000,
            digest_ttl_floor_ms=0,
        )
        return [v.text for v in verdicts if v.level == "warning" and v.stream == "d"]

    (warning,) = warned(24)
    assert "keeps records 24 h, staging 168 h" in warning and "copier redrive" in warning
    assert warned(168) == [] and warned(720) == []
