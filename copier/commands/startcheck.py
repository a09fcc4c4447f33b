"""What ``copier check-config`` reads to say what an application's start means (``copier.core.startpoint``).

With ``initialPositionInStreamExtended`` set, check-config judges the start
against the staging retention and the application's tables: the KCL lease
table (a lease with a checkpoint ignores the start; one created at
TRIM_HORIZON or LATEST by an earlier run does not start there) and the state
table (one holding another application's positions or digest batches would
make the new application take the running copier's shards over). Cheap on
purpose, since it runs before every start of the service: the first page of
the lease table (at most ``LEASES_READ`` leases), one BatchGetItem per 100
staging shards, one digest batch. What cannot be read is said as a warning,
never a refusal to start.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from copier.core.config import Config
from copier.core.errors import AwsError, CopierError
from copier.core.plan import PlanSettings
from copier.core.startpoint import SEQUENCE, Leases, ShardStates, judge_start
from copier.core.state import shard_key
from copier.core.streamsettings import StreamSettings, Verdict

__all__ = ["LEASES_READ", "read_leases", "read_states", "start_verdicts"]

LEASES_READ = 100
SENTINELS = ("TRIM_HORIZON", "LATEST", "AT_TIMESTAMP", "SHARD_END")


def start_verdicts(config: Config, streams: Any, staging: StreamSettings) -> list[Verdict]:
    """check-config's lines on the start (none without one); ``streams``: a ``KinesisStreams``."""
    if config.start_ms is None:
        return []
    out: list[Verdict] = []
    try:
        leases = read_leases(config)
    except CopierError as exc:
        out.append(Verdict(config.lease_table_name, "warning", f"lease table {config.lease_table_name}: {exc}"))
        leases = Leases(config.lease_table_name, exists=False)
    try:
        states = read_states(config, [s["ShardId"] for s in streams.shards(config.stream_name)])
    except CopierError as exc:
        out.append(Verdict(config.state_table_name, "warning", f"state table {config.state_table_name}: {exc}"))
        states = ShardStates(config.state_table_name, shards=0)
    now = int(time.time() * 1000)
    verdicts = judge_start(
        config.start_ms,
        now,
        staging.retention_ms,
        config.dedup_window_ms,
        config.stream_name,
        config.target_stream_name,
        leases,
        states,
    )
    return verdicts + out


def read_leases(config: Config) -> Leases:
    """The first page of the KCL lease table (``LEASES_READ`` leases), by checkpoint; absent: ``exists`` False."""
    from copier.adapters.kcltables import lease_items

    table = config.lease_table_name
    try:
        items, complete = lease_items(config, table, ["leaseKey", "checkpoint"], limit=LEASES_READ)
    except AwsError as exc:
        if exc.code == "ResourceNotFoundException":
            return Leases(table, exists=False)
        raise
    checkpoints: Counter[str] = Counter()
    for item in items:
        value = (item.get("checkpoint") or {}).get("S", "")
        checkpoints[value if value in SENTINELS else SEQUENCE] += 1
    return Leases(table, exists=True, checkpoints=checkpoints, complete=complete)


def read_states(config: Config, shard_ids: list[str]) -> ShardStates:
    """The state items of the staging shards listed, and the target of one digest batch found there."""
    from copier.adapters.dynamo import DynamoStateStore

    store = DynamoStateStore(config)
    keys = {shard_key(config.stream_name, shard): shard for shard in shard_ids}
    found = store.get_many(keys)
    loaded = Counter(s.prestart_ms for s in found.values() if s.prestart_ms is not None)
    other: str | None = None
    for key, state in found.items():
        if state.batches:
            batch = next(iter(store.batches(key, state.batches, page_size=1)), None)
            if batch is not None and batch.settings:
                try:
                    other = PlanSettings.decode(batch.settings, config.stream_name, keys[key]).target_stream or None
                except ValueError:
                    other = None  # settings this copier cannot read: the processors will say so
            break
    return ShardStates(
        config.state_table_name,
        shards=len(shard_ids),
        positions=Counter(s.prestart_ms for s in found.values() if s.position is not None),
        loaded=loaded,
        other_target=other,
    )
