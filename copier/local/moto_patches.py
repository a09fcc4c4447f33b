"""Runtime corrections to moto's Kinesis and DynamoDB models, applied by the local backend.

The copier's exactly-once guarantees are tested against moto. Where moto
disagrees with AWS in a way that the copier or the KCL depends on (shard
lineage after a reshard, the end of a closed shard, unique sequence numbers,
idempotent index creation), a test could pass locally and the code still be
wrong on AWS, or fail locally for a reason AWS never produces. Each patch
below replaces one moto method at runtime (site-packages is never edited),
says what moto gets wrong and why the copier needs it right, and is proven by
``tests/test_backend_conformance.py``.

The patches are written against moto's internals at the pinned version
(:data:`SUPPORTED_MOTO_VERSION`, from setup.cfg); :func:`apply` refuses any
other version rather than silently patching code it was not checked against.
moto's models are process-wide, so the patches are too: apply them once per
process, before the first request.
"""

from __future__ import annotations

import threading
from base64 import b64decode
from collections.abc import Callable
from typing import Any

import moto
from moto.core.responses import ActionResult
from moto.dynamodb.models import DynamoDBBackend
from moto.kinesis import models as kinesis_models
from moto.kinesis import responses as kinesis_responses
from moto.kinesis.exceptions import InvalidArgumentError, TooManyRecords, ValidationException
from moto.kinesis.utils import compose_shard_iterator, decompose_shard_iterator
from moto.utilities.utils import md5_hash

__all__ = ["SUPPORTED_MOTO_VERSION", "apply", "applied"]

SUPPORTED_MOTO_VERSION = "5.2.5"
MAX_HASH_KEY = 2**128 - 1
DEFAULT_MAX_RECORD_KIB = 1024  # a new stream's record limit (AWS: 1 MiB until UpdateMaxRecordSize raises it)
MAX_RECORD_KIB = 10 * 1024  # the most UpdateMaxRecordSize allows
MAX_PUT_RECORDS_BYTES = 10 * 1024 * 1024  # a PutRecords request, all entries together
MAX_GET_RECORDS_BYTES = 10 * 1024 * 1024  # a GetRecords response

Shard = kinesis_models.Shard
Stream = kinesis_models.Stream


def _replace(owner: type, name: str, function: Callable[..., Any]) -> None:
    """Replace ``owner.name``, which must exist: a renamed moto method fails loudly, not silently."""
    if not callable(getattr(owner, name, None)):
        raise RuntimeError(f"moto has no {owner.__module__}.{owner.__qualname__}.{name} to patch")
    setattr(owner, name, function)


# --- sequence numbers -------------------------------------------------------------------------

_sequence_lock = threading.Lock()
_last_sequence_number = 0


def _next_sequence_number_locked() -> int:
    """The next number of the process-wide counter; the caller holds ``_sequence_lock``."""
    global _last_sequence_number
    _last_sequence_number += 1
    return _last_sequence_number


def _next_sequence_number() -> int:
    """The next number of the process-wide, strictly increasing counter."""
    with _sequence_lock:
        return _next_sequence_number_locked()


def _patch_sequence_numbers() -> None:
    """Give every record a unique, increasing sequence number, and every shard a fixed range.

    moto numbers a record ``max(shard's numbers) + 1`` without a lock, so two
    concurrent PutRecords into one shard can draw the same number and the
    second silently overwrites the first: an acknowledged record is lost,
    which is exactly the failure the copier exists to prevent. And moto
    reads a shard in insertion order, skipping numbers below the last one it
    returned, so a record stored after a higher-numbered one is never read:
    numbers must be drawn and records stored in one step. Numbers also
    restart at 1 in every shard, so a child shard's records sort *below* its
    parent's, while AWS numbers a child's records above its parents'.
    moto also reports a shard's StartingSequenceNumber as its first record's
    number ("0" while empty), so it moves when the first record arrives.

    Patched: one locked counter for the whole process (unique and increasing
    across all shards, children above parents), held while the record is
    stored; a shard reserves its StartingSequenceNumber when it is created;
    a closed shard's EndingSequenceNumber is its last record's number, or its
    starting number if it never held a record.
    """
    original_init = Shard.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.starting_sequence_number = _next_sequence_number()

    def put_record(self: Any, partition_key: str, data: str, explicit_hash_key: str) -> str:
        # Draw and store under one lock: moto reads a shard in insertion order and
        # skips any number below one it has passed, so a record stored after a
        # higher-numbered one would never be read.
        with _sequence_lock:
            sequence_number = _next_sequence_number_locked()
            self.records[sequence_number] = kinesis_models.Record(
                partition_key, data, sequence_number, explicit_hash_key
            )
        return str(sequence_number)

    original_to_json = Shard.to_json

    def to_json(self: Any) -> dict[str, Any]:
        body: dict[str, Any] = original_to_json(self)
        start = getattr(self, "starting_sequence_number", 0)
        body["SequenceNumberRange"]["StartingSequenceNumber"] = str(start)
        if not self.is_open:
            end = self.get_max_sequence_number() if self.records else start
            body["SequenceNumberRange"]["EndingSequenceNumber"] = str(end)
        return body

    _replace(Shard, "__init__", __init__)
    _replace(Shard, "put_record", put_record)
    _replace(Shard, "to_json", to_json)


# --- routing ----------------------------------------------------------------------------------


def _patch_routing() -> None:
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

    _replace(Stream, "get_shard_for_key", get_shard_for_key)


# --- resharding -------------------------------------------------------------------------------


def _new_shard_index(stream: Any) -> int:
    return int(max(s._shard_id for s in stream.shards.values())) + 1


def _closed_error(stream: Any, shard: Any) -> InvalidArgumentError:
    return InvalidArgumentError(
        message=f"Shard {shard.shard_id} in stream {stream.stream_name} under account {stream.account_id} "
        "has already been merged or split, and thus is not eligible for merging or splitting."
    )


def _patch_split() -> None:
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

    _replace(Stream, "split_shard", split_shard)


def _patch_merge() -> None:
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

    _replace(Stream, "merge_shards", merge_shards)


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


def _patch_get_records() -> None:
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

    _replace(kinesis_models.KinesisBackend, "get_records", backend_get_records)
    _replace(kinesis_responses.KinesisResponse, "get_records", response_get_records)


# --- DynamoDB ---------------------------------------------------------------------------------


def _record_size(record: dict[str, Any]) -> int:
    """What a PutRecords entry counts against the limits: its data and its partition key (UTF-8)."""
    return len(b64decode(record.get("Data", ""))) + len(str(record.get("PartitionKey", "")).encode("utf-8"))


def _max_record_bytes(stream: Any) -> int:
    return int(getattr(stream, "max_record_size_kib", DEFAULT_MAX_RECORD_KIB)) * 1024


def _patch_record_limits() -> None:
    """Per-stream record limits, as Kinesis has them since UpdateMaxRecordSize: up to 10 MiB a record.

    moto refuses any record over 1 MiB and any PutRecords over 5 MiB, knows
    no ``UpdateMaxRecordSize`` and leaves ``MaxRecordSizeInKiB`` out of
    DescribeStreamSummary. On AWS a stream's limit is 1 MiB until raised (to
    at most 10,240 KiB), a PutRecords request may carry 10 MiB, and a record
    over its stream's limit is refused with a ValidationException. The copier
    must be tested with a staging stream whose records the target cannot
    take (they go to the dead-letter stream).
    """
    original_summary = Stream.to_json_summary

    def to_json_summary(self: Any) -> dict[str, Any]:
        body: dict[str, Any] = original_summary(self)
        body["StreamDescriptionSummary"]["MaxRecordSizeInKiB"] = _max_record_bytes(self) // 1024
        return body

    def check_sizes(stream: Any, records: list[dict[str, Any]]) -> list[int]:
        sizes = [_record_size(r) for r in records]
        if sum(sizes) > MAX_PUT_RECORDS_BYTES:
            raise ValidationException(
                value=str(sum(sizes)), position="records", regex_to_match=f"a total of {MAX_PUT_RECORDS_BYTES} bytes"
            )
        limit = _max_record_bytes(stream)
        for position, size in enumerate(sizes, 1):
            if size > limit:
                raise ValidationException(
                    value=str(size), position=f"records.{position}.member.data", regex_to_match=f"<= {limit} bytes"
                )
        return sizes

    def put_records(self: Any, stream_arn: str, stream_name: str, records: list[dict[str, Any]]) -> dict[str, Any]:
        stream = self.describe_stream(stream_arn=stream_arn, stream_name=stream_name)
        if len(records) > 500:
            raise TooManyRecords
        sizes = check_sizes(stream, records)
        response: dict[str, Any] = {"FailedRecordCount": 0, "Records": []}
        for record in records:
            sequence_number, shard_id = stream.put_record(
                record.get("PartitionKey"), record.get("ExplicitHashKey"), record.get("Data")
            )
            response["Records"].append({"SequenceNumber": sequence_number, "ShardId": shard_id})
        self._send_stream_metrics(stream.stream_name, incoming_bytes=sum(sizes), incoming_records=len(records))
        return response

    original_put_record = kinesis_models.KinesisBackend.put_record

    def put_record(
        self: Any, stream_arn: str, stream_name: str, partition_key: str, explicit_hash_key: str, data: str
    ) -> tuple[str, str]:
        stream = self.describe_stream(stream_arn=stream_arn, stream_name=stream_name)
        check_sizes(stream, [{"PartitionKey": partition_key, "Data": data}])
        result: tuple[str, str] = original_put_record(
            self, stream_arn, stream_name, partition_key, explicit_hash_key, data
        )
        return result

    def update_max_record_size(self: Any) -> ActionResult:
        stream_arn = self._get_param("StreamARN")
        size = self._get_param("MaxRecordSizeInKiB")
        if not isinstance(size, int) or not DEFAULT_MAX_RECORD_KIB <= size <= MAX_RECORD_KIB:
            raise ValidationException(
                value=str(size), position="maxRecordSizeInKiB", regex_to_match=f"1024 to {MAX_RECORD_KIB}"
            )
        stream = self.kinesis_backend.describe_stream(stream_arn=stream_arn, stream_name=None)
        stream.max_record_size_kib = size
        return ActionResult({})

    _replace(Stream, "to_json_summary", to_json_summary)
    _replace(kinesis_models.KinesisBackend, "put_records", put_records)
    _replace(kinesis_models.KinesisBackend, "put_record", put_record)
    setattr(kinesis_responses.KinesisResponse, "update_max_record_size", update_max_record_size)  # noqa: B010 - an action moto lacks


def _patch_record_distribution() -> None:
    """``RecordDistributionStrategy``, which moto does not know: under ``AUTO`` Kinesis ignores the partition
    key and ExplicitHashKey and spreads records over the open shards; ``USER_PARTITION_KEY`` (the default)
    routes by them. ``UpdateStreamRecordDistributionStrategy`` switches it at once; DescribeStreamSummary
    reports it. Emulated here (records spread round robin) so the copier's handling of a stream that
    ignores keys runs against the local backend and in the chaos suite.
    """
    original_summary = Stream.to_json_summary
    original_route = Stream.get_shard_for_key

    def to_json_summary(self: Any) -> dict[str, Any]:
        body: dict[str, Any] = original_summary(self)
        body["StreamDescriptionSummary"]["RecordDistributionStrategy"] = getattr(
            self, "record_distribution", "USER_PARTITION_KEY"
        )
        return body

    def get_shard_for_key(self: Any, partition_key: str, explicit_hash_key: str | None) -> Any:
        shard = original_route(self, partition_key, explicit_hash_key)  # type: ignore[arg-type]  # validates the key
        if getattr(self, "record_distribution", "USER_PARTITION_KEY") != "AUTO":
            return shard
        open_shards = [s for s in self.shards.values() if s.is_open]
        self.auto_turn = getattr(self, "auto_turn", -1) + 1
        return open_shards[self.auto_turn % len(open_shards)] if open_shards else shard

    def update_stream_record_distribution_strategy(self: Any) -> ActionResult:
        strategy = self._get_param("RecordDistributionStrategy")
        if strategy not in ("AUTO", "USER_PARTITION_KEY"):
            raise ValidationException(
                value=str(strategy), position="recordDistributionStrategy", regex_to_match="AUTO|USER_PARTITION_KEY"
            )
        stream = self.kinesis_backend.describe_stream(stream_arn=self._get_param("StreamARN"), stream_name=None)
        stream.record_distribution = strategy
        return ActionResult({})

    _replace(Stream, "to_json_summary", to_json_summary)
    _replace(Stream, "get_shard_for_key", get_shard_for_key)
    setattr(  # noqa: B010 - an action moto lacks
        kinesis_responses.KinesisResponse,
        "update_stream_record_distribution_strategy",
        update_stream_record_distribution_strategy,
    )


def _patch_duplicate_gsi_create() -> None:
    """UpdateTable creating a global secondary index that already exists is a no-op.

    moto raises a bare ValueError, which its server turns into an HTTP 500.
    When two KCL 3 workers start together, both see the lease table without
    its LeaseOwnerToLeaseKeyIndex and both ask UpdateTable to create it; the
    AWS SDK retries the 500 nine times and the KCL then fails that
    initialisation attempt. AWS answers such a race with a 4xx that the KCL
    survives (the index does get created); the no-op gives the same end
    state without the 500 storm. Other updates in the same call still apply.
    """
    original = DynamoDBBackend.update_table_global_indexes

    def update_table_global_indexes(self: Any, table: Any, global_index_updates: list[dict[str, Any]]) -> None:
        existing = {index.name for index in table.global_indexes}
        wanted = [u for u in global_index_updates if not (u.get("Create") and u["Create"]["IndexName"] in existing)]
        original(self, table, wanted)

    _replace(DynamoDBBackend, "update_table_global_indexes", update_table_global_indexes)


# --- applying ---------------------------------------------------------------------------------

PATCHES: tuple[Callable[[], None], ...] = (
    _patch_sequence_numbers,
    _patch_routing,
    _patch_split,
    _patch_merge,
    _patch_get_records,
    _patch_duplicate_gsi_create,
    _patch_record_limits,
    _patch_record_distribution,
)

_apply_lock = threading.Lock()
_applied = False


def applied() -> bool:
    """Whether :func:`apply` has run in this process."""
    return _applied


def apply() -> None:
    """Apply every patch once per process; later calls do nothing.

    Raises RuntimeError if the installed moto is not the version the patches
    were written and tested against.
    """
    global _applied
    with _apply_lock:
        if _applied:
            return
        if moto.__version__ != SUPPORTED_MOTO_VERSION:
            raise RuntimeError(
                f"copier.local.moto_patches supports moto {SUPPORTED_MOTO_VERSION}, found {moto.__version__}: "
                "re-check the patches against the new moto and run tests/test_backend_conformance.py"
            )
        for patch in PATCHES:
            patch()
        _applied = True
