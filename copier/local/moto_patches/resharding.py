"""The moto patches for resharding: routing writes to open shards, SplitShard, MergeShards, reading a closed shard.

Shard lineage after a reshard and the end of a closed shard are what the KCL
and the copier depend on to read parents before children; moto gets each of
them wrong (see each patch).
"""

from __future__ import annotations

from base64 import b64decode
from typing import Any

from moto.core.responses import ActionResult
from moto.kinesis import models as kinesis_models
from moto.kinesis import responses as kinesis_responses
from moto.kinesis.exceptions import InvalidArgumentError
from moto.kinesis.utils import compose_shard_iterator, decompose_shard_iterator
from moto.utilities.utils import md5_hash

from copier.local.moto_patches.replace import replace

__all__ = ["patch_get_records", "patch_merge", "patch_routing", "patch_split"]

MAX_HASH_KEY = 2**128 - 1
MAX_GET_RECORDS_BYTES = 10 * 1024 * 1024  # a GetRecords response

Shard = kinesis_models.Shard
Stream = kinesis_models.Stream

# --- routing ----------------------------------------------------------------------------------


def patch_routing() -> None:
    """Route a record only to the open shard whose hash key range contains its key, bounds included.

    moto scans every shard, closed ones included, in creation order, so after
    a SplitShard or MergeShards the closed parent (created first) still takes
    every new write; and it tests ``key < EndingHashKey``, so the last hash
    key of every shard is routed nowhere (a crash inside moto). On AWS a
    closed shard never receives another record, which is what lets the KCL
    finish it and move on to its children.
    """

    def get_shard_for_key(self: Any, partition_key: str, explicit_hash_key: str | None) -> Any:
        if not isinstance(partition_key, str) or len(partition_key) > 256:
            raise InvalidArgumentError("partition_key")
        if explicit_hash_key:
            if not isinstance(explicit_hash_key, str):
                raise InvalidArgumentError("explicit_hash_key")
            key = int(explicit_hash_key)
            if not 0 <= key <= MAX_HASH_KEY:
                raise InvalidArgumentError("explicit_hash_key")
        else:
            key = int(md5_hash(partition_key.encode("utf-8")).hexdigest(), 16)
        for shard in self.shards.values():
            if shard.is_open and shard.starting_hash <= key <= shard.ending_hash:
                return shard
        return None

    replace(Stream, "get_shard_for_key", get_shard_for_key)


# --- resharding -------------------------------------------------------------------------------


def _new_shard_index(stream: Any) -> int:
    return int(max(s._shard_id for s in stream.shards.values())) + 1


def _closed_error(stream: Any, shard: Any) -> InvalidArgumentError:
    return InvalidArgumentError(
        message=f"Shard {shard.shard_id} in stream {stream.stream_name} under account {stream.account_id} "
        "has already been merged or split, and thus is not eligible for merging or splitting."
    )


def patch_split() -> None:
    """SplitShard closes the parent, which keeps its records, and opens two empty children.

    moto empties the parent and re-puts its records through the (broken)
    router, which sends them straight back into the parent under new sequence
    numbers: positions the KCL or the copier had already recorded stop
    existing. On AWS a split moves no data: the parent keeps its records and
    is read to its end, then the children are read from their start.
    moto also rejects a split at the parent's EndingHashKey, which AWS allows
    (the second child is then a single hash key).
    """

    def split_shard(self: Any, shard_to_split: str, new_starting_hash_key: str) -> None:
        parent = self.shards[shard_to_split]
        split_at = int(new_starting_hash_key)
        if not parent.starting_hash < split_at <= parent.ending_hash:
            raise InvalidArgumentError(
                message=f"NewStartingHashKey {split_at} used in SplitShard() on shard {shard_to_split} in stream "
                f"{self.stream_name} under account {self.account_id} is not both greater than the shard's "
                f"StartingHashKey {parent.starting_hash} and at most its EndingHashKey {parent.ending_hash}."
            )
        if not parent.is_open:
            raise _closed_error(self, parent)
        index = _new_shard_index(self)
        low = Shard(index, parent.starting_hash, split_at - 1, parent=parent.shard_id)
        high = Shard(index + 1, split_at, parent.ending_hash, parent=parent.shard_id)
        parent.is_open = False
        self.shards[low.shard_id] = low
        self.shards[high.shard_id] = high

    replace(Stream, "split_shard", split_shard)


def patch_merge() -> None:
    """MergeShards closes both parents, which keep their records, and opens one empty child.

    moto copies both parents' records into the child, so every merged record
    exists twice and a consumer that reads parents then child (the KCL)
    delivers it twice; it also merges closed shards and mis-checks adjacency
    when the second shard lies below the first. On AWS the child starts
    empty and covers both parents' hash key ranges.

    moto's UpdateShardCount is built from these two methods, so it inherits
    both fixes and needs no patch of its own: each new shard has one parent
    (split) or two adjacent parents (merge). (It cannot reach a target above
    twice the open shard count in one call; AWS rejects such a target.)
    """

    def merge_shards(self: Any, shard_to_merge: str, adjacent_shard_to_merge: str) -> None:
        first = self.shards[shard_to_merge]
        second = self.shards[adjacent_shard_to_merge]
        for shard in (first, second):
            if not shard.is_open:
                raise _closed_error(self, shard)
        if first.ending_hash + 1 == second.starting_hash:
            low, high = first, second
        elif second.ending_hash + 1 == first.starting_hash:
            low, high = second, first
        else:
            raise InvalidArgumentError(
                message=f"Shards {shard_to_merge} and {adjacent_shard_to_merge} in stream {self.stream_name} "
                f"under account {self.account_id} are not an adjacent pair of shards eligible for merging"
            )
        child = Shard(
            _new_shard_index(self),
            low.starting_hash,
            high.ending_hash,
            parent=first.shard_id,
            adjacent_parent=second.shard_id,
        )
        first.is_open = False
        second.is_open = False
        self.shards[child.shard_id] = child

    replace(Stream, "merge_shards", merge_shards)


# --- reading a closed shard -------------------------------------------------------------------


def _child_shards(stream: Any, shard: Any) -> list[dict[str, Any]]:
    """The GetRecords ``ChildShards`` entries of ``shard``: every shard that names it as a parent."""
    children = []
    for candidate in sorted(stream.shards.values(), key=lambda s: s._shard_id):
        parents = [p for p in (candidate.parent, candidate.adjacent_parent) if p]
        if shard.shard_id in parents:
            children.append(
                {
                    "ShardId": candidate.shard_id,
                    "ParentShards": parents,
                    "HashKeyRange": {
                        "StartingHashKey": str(candidate.starting_hash),
                        "EndingHashKey": str(candidate.ending_hash),
                    },
                }
            )
    return children


def patch_get_records() -> None:
    """GetRecords on a closed shard read to its end returns no NextShardIterator and lists ChildShards; a
    response holds at most 10 MiB of records, as on AWS (moto returns any number of bytes).

    moto always returns a NextShardIterator and never ChildShards, so a
    closed shard looks like an idle open one forever: the KCL never reaches
    SHARD_END, never checkpoints it, and never starts the children (they wait
    for their parents' SHARD_END), and a copier test of a reshard can never
    finish. On AWS the response that reaches the end of a closed shard has a
    null NextShardIterator and the ChildShards (ShardId, ParentShards,
    HashKeyRange).
    """

    def backend_get_records(
        self: Any, stream_arn: str | None, shard_iterator: str, limit: int | None
    ) -> tuple[str | None, list[Any], int, list[dict[str, Any]] | None]:
        stream_name, shard_id, last_sequence_id = decompose_shard_iterator(shard_iterator)
        stream = self.describe_stream(stream_arn=stream_arn, stream_name=stream_name)
        shard = stream.get_shard(shard_id)
        records, last_sequence, millis_behind = shard.get_records(last_sequence_id, limit)
        total = 0
        for kept, record in enumerate(records):  # AWS: at most 10 MiB a response (moto: no bound)
            total += len(b64decode(record.data)) + len(record.partition_key.encode("utf-8"))
            if total > MAX_GET_RECORDS_BYTES and kept > 0:
                records = records[:kept]
                last_sequence = records[-1].sequence_number
                break
        if not shard.is_open and (not shard.records or int(last_sequence) >= shard.get_max_sequence_number()):
            return None, records, millis_behind, _child_shards(stream, shard)
        return compose_shard_iterator(stream_name, shard, last_sequence), records, millis_behind, None

    def response_get_records(self: Any) -> ActionResult:
        next_iterator, records, millis_behind, children = self.kinesis_backend.get_records(
            self._get_param("StreamARN"), self._get_param("ShardIterator"), self._get_param("Limit")
        )
        body: dict[str, Any] = {
            "Records": [record.to_json() for record in records],
            "MillisBehindLatest": millis_behind,
        }
        if next_iterator is not None:
            body["NextShardIterator"] = next_iterator
        if children is not None:
            body["ChildShards"] = children
        return ActionResult(body)

    replace(kinesis_models.KinesisBackend, "get_records", backend_get_records)
    replace(kinesis_responses.KinesisResponse, "get_records", response_get_records)
