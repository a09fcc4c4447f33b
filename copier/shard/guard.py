"""The stream settings a shard's exactly-once depends on, watched while it forwards (docs/protocol.md, "Stream
settings").

Before each chunk: records this staging shard's hash key range does not
hold were put here against their key (the staging stream ignores keys,
``RecordDistributionStrategy = AUTO``, perhaps only for a while, or the
producer set an ExplicitHashKey), so a copy of the same event may be on
another shard, forwarded by its processor: they are reported before their
put (``copier.shard.pipeline``). And forwarding stops, holding the lease,
while a setting makes exactly-once impossible (``copier.core.streamsettings``:
the staging stream ignoring keys, or the target doing so under
``copier.ordering = partitionKey``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from copier.core.plan import SourceRecord
from copier.core.positions import Position
from copier.core.streamsettings import blocking
from copier.shard.session import ShardSession

__all__ = ["StreamGuard"]


class StreamGuard:
    """Watches the staging shard's records and the streams' settings for one processor."""

    def __init__(self, session: ShardSession) -> None:
        self.s = session
        self._range: tuple[int, int] | None = None  # this staging shard's hash key range
        self._blocking: str | None = None  # "staging" or "target": the stream whose setting stopped forwarding

    def own_range(self) -> tuple[int, int]:
        """This staging shard's hash key range, from ListShards (closed shards keep theirs), read once (from the
        listing the takeover's lineage walk took, when it is seconds old: ``Streams.shard_entry``). A shard
        ListShards does not list gets an empty range: every record counts as outside it (reported), never
        none."""
        s = self.s
        if self._range is None:
            stream = s.config.stream_name
            mine = s.retrying("list_staging_shards", lambda: s.streams.shard_entry(stream, s.shard_id))
            if mine is None or "HashKeyRange" not in mine:
                s.log.warning(
                    "shard_range_unknown",
                    detail="ListShards does not list this shard: every record is taken as put here against its "
                    "partition key (reported as a possible duplicate)",
                )
                self._range = (1, 0)
            else:
                keys = mine["HashKeyRange"]
                self._range = (int(keys["StartingHashKey"]), int(keys["EndingHashKey"]))
        return self._range

    def scattered(self, records: Sequence[SourceRecord], hashes: Mapping[str, int]) -> set[Position]:
        """Records whose partition key this shard's hash range does not hold (``hashes``: each key's
        ``hash_key``, ``copier.core.shardmap.key_hashes``). KPL aggregates never show here (the KCL drops their
        user records outside the range before copier sees them)."""
        low, high = self.own_range()
        return {r.position for r in records if not low <= hashes[r.partition_key] <= high}

    def await_streams(self, refresh: bool) -> None:
        """Stop forwarding while a stream setting makes exactly-once impossible, holding the lease and
        looking again every copier.maxBackoffMillis. The answers are cached (SUMMARY_MAX_AGE_S: a switch is
        seen within that while forwarding); ``refresh`` (records suggest a staging switch) asks again for the
        staging stream after SUMMARY_RETRY_S, and so does being blocked, for the stream that blocks (only it:
        DescribeStreamSummary's 20 calls a second are the account's): a switch back is seen within
        SUMMARY_RETRY_S and a backoff of the last successful call (a failed one is asked again SUMMARY_RETRY_S
        later). FencedError goes up."""
        s = self.s
        while True:
            staging = s.streams.settings(s.config.stream_name, refresh=refresh or self._blocking == "staging")
            target = s.streams.settings(s.config.target_stream_name, refresh=self._blocking == "target")
            problem = blocking(staging, target, s.config.ordering)
            if problem is None:
                if self._blocking:
                    self._blocking = None
                    s.stalls.over()
                    s.log.warning("stream_settings_ok", detail="forwarding again")
                return
            self._blocking = "staging" if staging is not None and staging.auto else "target"
            assert s.state is not None
            if staging is not None and staging.auto and "auto_seen_ms" not in s.state.counters:
                s.write(replace(s.state, counters={**s.state.counters, "auto_seen_ms": s.clock.now_ms()}))
            s.stalls.begin("stream_settings", self._blocking, problem)
            s.emit()
            s.log.error("stream_settings_block", detail=problem)
            s.write(s.state)  # the lease is kept (nobody else would do better), and the stall recorded
            s.clock.sleep_ms(s.config.max_backoff_millis)
