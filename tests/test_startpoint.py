"""A new application's start: the keys that set it, and what ``copier check-config`` says it means (against the
staging retention, the KCL lease table and the state table); copier.core.startpoint, copier.commands.startcheck."""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from copier.adapters.dynamo import DynamoStateStore
from copier.core.config import load_config
from copier.core.errors import ConfigError
from copier.core.plan import PlanSettings
from copier.core.positions import Position
from copier.core.startpoint import SEQUENCE, Leases, ShardStates, judge_start, parse_start
from copier.core.state import DigestBatch, ShardState, shard_key
from tests.conftest import Pipeline
from tests.support.backend import DUMMY_ENV, ROOT
from tests.support.fakes import config

HOUR = 3_600_000
NOW = 1_700_000_000_000
DAY = 24 * HOUR


def verdicts(
    start_ms: int = NOW - HOUR,
    retention_ms: int | None = DAY,
    leases: Leases | None = None,
    states: ShardStates | None = None,
) -> list[tuple[str, str]]:
    found = judge_start(
        start_ms,
        NOW,
        retention_ms,
        HOUR,
        "staging",
        "target",
        leases or Leases("app", exists=False),
        states or ShardStates("app-copier-state", shards=4),
    )
    return [(v.level, v.text) for v in found]


def levels(found: list[tuple[str, str]]) -> Counter[str]:
    return Counter(level for level, _ in found)


def said(found: list[tuple[str, str]], level: str, text: str) -> bool:
    return any(lv == level and text in t for lv, t in found)


# -- the keys ---------------------------------------------------------------------------------------------------


def test_the_start_is_the_kcl_key_in_epoch_seconds_read_as_milliseconds() -> None:
    assert config({"initialPositionInStreamExtended": 1_700_000_000}).start_ms == NOW
    assert config().start_ms is None
    assert config().lease_table_name == "app"
    assert config({"tableName": "leases"}).lease_table_name == "leases"


@pytest.mark.parametrize(
    ("lines", "key", "problem"),
    [
        ({"initialPositionInStream": "AT_TIMESTAMP"}, "initialPositionInStream", "refuses AT_TIMESTAMP here"),
        (
            {"initialPositionInStream": "TRIM_HORIZON", "initialPositionInStreamExtended": "1700000000"},
            "initialPositionInStream",
            "no fixed order",
        ),
        ({"initialPositionInStreamExtended": "1700000000000"}, "initialPositionInStreamExtended", "epoch seconds"),
        ({"initialPositionInStreamExtended": "2026-01-01"}, "initialPositionInStreamExtended", "epoch seconds"),
    ],
)
def test_a_start_the_daemon_would_refuse_or_read_otherwise_is_a_config_error(
    lines: dict[str, str], key: str, problem: str
) -> None:
    """AT_TIMESTAMP in initialPositionInStream stops the daemon; with both keys either may win (a Java
    Hashtable's order); milliseconds or a date are not what the daemon's Long.parseLong * 1000 takes."""
    with pytest.raises(ConfigError) as caught:
        config(lines)
    assert caught.value.key == key and problem in str(caught.value)
    assert parse_start({"initialPositionInStream": "LATEST"}, "f") is None


# -- against the staging retention --------------------------------------------------------------------------------


def test_a_start_inside_the_retention_says_what_it_means_and_how_much_time_the_backlog_has() -> None:
    found = verdicts(start_ms=NOW - 2 * HOUR)
    assert levels(found) == Counter({"ok": 4})
    assert said(found, "ok", "forwards every event that arrived in staging at or after it, none that arrived before")
    assert said(found, "ok", "is dropped until 3600 s after the start")
    assert said(found, "ok", "a retry of an older event, or a later one, is forwarded")
    assert said(found, "ok", "start is 2.0 h ago, 22.0 h inside the retention of staging (24.0 h)")
    assert said(found, "ok", "lease table app: no lease yet: every shard starts at the start")
    assert said(found, "ok", "state table app-copier-state: no shard has begun yet")


def test_a_start_older_than_the_retention_is_an_error_naming_the_trim_horizon() -> None:
    """The KCL would start each shard at its oldest record, not at the start: the events between are gone."""
    found = verdicts(start_ms=NOW - 25 * HOUR)
    assert said(found, "error", "is 25.0 h ago and staging keeps 24.0 h")
    assert said(found, "error", "2023-11-13T22:13:20Z (the trim horizon) is gone")


def test_a_window_before_the_start_past_the_retention_is_a_warning() -> None:
    """A producer retry after the start of an event that expired from staging cannot be recognised."""
    found = verdicts(start_ms=NOW - DAY + HOUR // 2)
    assert levels(found)["error"] == 0
    assert said(found, "warning", "reach back past the trim horizon")


def test_a_start_in_the_future_is_an_error() -> None:
    """Kinesis refuses GetShardIterator AT_TIMESTAMP later than its clock."""
    assert said(verdicts(start_ms=NOW + HOUR), "error", "Kinesis refuses GetShardIterator AT_TIMESTAMP")


def test_an_unreadable_retention_is_a_warning() -> None:
    assert said(verdicts(retention_ms=None), "warning", "could not be read")


# -- against the tables --------------------------------------------------------------------------------------------


def test_leases_with_checkpoints_ignore_the_start_and_the_retention_no_longer_matters() -> None:
    """A running application: the KCL resumes from its checkpoints; a start now older than the retention is no
    error (it was read when the application began)."""
    leases = Leases("app", exists=True, checkpoints=Counter({SEQUENCE: 3, "SHARD_END": 1}))
    began = NOW - 30 * HOUR
    states = ShardStates("app-copier-state", shards=4, positions=Counter({began: 3}), loaded=Counter({began: 4}))
    found = verdicts(start_ms=NOW - 30 * HOUR, leases=leases, states=states)
    assert levels(found)["error"] == 0 and levels(found)["warning"] == 0, found
    assert said(found, "ok", "4 leases have checkpoints: the KCL resumes those shards from them and ignores")
    assert said(found, "ok", "4 of 4 staging shards hold the events from before the start")


def test_leases_a_run_without_the_start_created_are_said_trim_horizon_warned_latest_refused() -> None:
    leases = Leases("app", exists=True, checkpoints=Counter({"TRIM_HORIZON": 2, "LATEST": 1, "AT_TIMESTAMP": 1}))
    found = verdicts(leases=leases)
    assert said(found, "warning", "2 leases start at TRIM_HORIZON, not at the start")
    assert said(found, "error", "1 leases start at LATEST, not at the start")
    assert said(found, "ok", "1 leases not read yet: they start at the start")
    partial = verdicts(leases=Leases("app", exists=True, checkpoints=Counter({"LATEST": 100}), complete=False))
    assert said(partial, "error", "100 leases (of the first 100 read) start at LATEST")


def test_another_applications_state_table_is_an_error() -> None:
    """Positions with no lease checkpoint: the new application's processors would take the running copier's
    shards over (fencing it) and go on from its positions; digest batches of a copy to another target say the
    same whatever the leases."""
    found = verdicts(states=ShardStates("shared", shards=4, positions=Counter({None: 4})))
    assert said(found, "error", "holds committed positions of 4 staging shards, and the lease table no checkpoint")
    other = verdicts(states=ShardStates("shared", shards=4, positions=Counter({None: 4}), other_target="first-target"))
    assert said(other, "error", "holds the digest batches of a copy to first-target, not to target")


def test_a_new_application_restarted_before_its_first_kcl_checkpoint_is_not_taken_for_another() -> None:
    """Positions committed after loading the events before this start are this application's own: a restart
    before the KCL checkpointed (every minute) must pass the service's check-config."""
    start = NOW - HOUR
    states = ShardStates("s", shards=2, positions=Counter({start: 2}), loaded=Counter({start: 2}))
    found = verdicts(
        start_ms=start, leases=Leases("app", exists=True, checkpoints=Counter({"AT_TIMESTAMP": 2})), states=states
    )
    assert levels(found)["error"] == 0, found


def test_a_start_changed_after_the_application_began_is_an_error() -> None:
    """The processors refuse it (``copier.shard.prestart.PreStart.refuse_changed``): so does check-config."""
    leases = Leases("app", exists=True, checkpoints=Counter({SEQUENCE: 2}))
    states = ShardStates("s", shards=2, positions=Counter({NOW - 5 * HOUR: 2}), loaded=Counter({NOW - 5 * HOUR: 2}))
    found = verdicts(start_ms=NOW - 2 * HOUR, leases=leases, states=states)
    assert said(found, "error", "2 shards began at 2023-11-14T17:13:20Z, not at 2023-11-14T20:13:20Z")


# -- check-config on the local backend ------------------------------------------------------------------------------

COPIER = str(ROOT / ".venv" / "bin" / "copier")


def check_config(props: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COPIER, "check-config", str(props)],
        capture_output=True,
        text=True,
        env={**os.environ, **DUMMY_ENV},
        timeout=120,
    )


def with_start(pipeline: Pipeline, start_s: int) -> Path:
    props = pipeline.write_properties()
    lease_table = f"{pipeline.table}-leases"
    with props.open("a") as out:
        out.write(f"initialPositionInStreamExtended = {start_s}\ntableName = {lease_table}\n")
    return props


def test_check_config_of_a_new_application_says_what_its_start_means(pipeline: Pipeline) -> None:
    """No lease table and an empty state table: the start, the retention, the tables; exit 0."""
    result = check_config(with_start(pipeline, int(time.time()) - 3600))
    assert result.returncode == 0, result.stderr
    assert "forwards every event that arrived in" in result.stdout
    assert "inside the retention of" in result.stdout
    assert f"lease table {pipeline.table}-leases: no lease yet" in result.stdout
    assert f"state table {pipeline.table}: no shard has begun yet" in result.stdout


def test_check_config_refuses_another_applications_tables_and_a_start_past_the_retention(pipeline: Pipeline) -> None:
    """Read from the backend: leases created at LATEST by a run without the start, a state table holding another
    application's position and digest batch, a start 25 h ago: each an error, exit 4."""
    props = with_start(pipeline, int(time.time()) - 25 * 3600)
    shard = pipeline.kinesis.list_shards(StreamName=pipeline.staging)["Shards"][0]["ShardId"]
    pipeline.dynamodb.create_table(
        TableName=f"{pipeline.table}-leases",
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    pipeline.dynamodb.put_item(
        TableName=f"{pipeline.table}-leases", Item={"leaseKey": {"S": shard}, "checkpoint": {"S": "LATEST"}}
    )
    cfg = load_config(props)
    store = DynamoStateStore(cfg)
    key = shard_key(pipeline.staging, shard)
    store.replace_if_unchanged(key, None, ShardState(epoch=1, version=1, position=Position(5), batches=1))
    settings = PlanSettings(cfg.dedup_key, "forward", None, pipeline.staging, shard, target_stream="first-target")
    store.put_batch(key, DigestBatch(index=1, epoch=1, last=Position(5), started_ms=1, settings=settings.encode()))
    result = check_config(props)
    assert result.returncode == 4, result.stdout + result.stderr
    assert "the trim horizon) is gone" in result.stderr
    assert "1 leases start at LATEST" in result.stderr
    assert f"holds the digest batches of a copy to first-target, not to {pipeline.target}" in result.stderr
    plain = check_config(pipeline.write_properties())  # the same tables, without a start: nothing said of them
    assert plain.returncode == 0, plain.stderr
    assert "forwards every event that arrived" not in plain.stdout and "LATEST" not in plain.stderr
