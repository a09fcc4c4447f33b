"""The moto patches for per-stream settings moto lacks: the record size limit and the record distribution strategy.

Kinesis has them (UpdateMaxRecordSize, UpdateStreamRecordDistributionStrategy,
both reported by DescribeStreamSummary); the copier reads them
(``copier.core.streamsettings``) and must be tested with a staging stream whose
records the target cannot take, and with a stream that ignores partition keys.
"""

from __future__ import annotations

from base64 import b64decode
from typing import Any

from moto.core.exceptions import JsonRESTError
from moto.core.responses import ActionResult
from moto.kinesis import models as kinesis_models
from moto.kinesis import responses as kinesis_responses
from moto.kinesis.exceptions import TooManyRecords, ValidationException

from copier.local.moto_patches.replace import replace

__all__ = ["patch_record_distribution", "patch_record_limits"]

DEFAULT_MAX_RECORD_KIB = 1024  # a new stream's record limit (AWS: 1 MiB until UpdateMaxRecordSize raises it)
MAX_RECORD_KIB = 10 * 1024  # the most UpdateMaxRecordSize allows
MAX_PUT_RECORDS_BYTES = 10 * 1024 * 1024  # a PutRecords request, all entries together

Stream = kinesis_models.Stream


def _record_size(record: dict[str, Any]) -> int:
    """What a PutRecords entry counts against the limits: its data and its partition key (UTF-8)."""
    return len(b64decode(record.get("Data", ""))) + len(str(record.get("PartitionKey", "")).encode("utf-8"))


def _max_record_bytes(stream: Any) -> int:
    return int(getattr(stream, "max_record_size_kib", DEFAULT_MAX_RECORD_KIB)) * 1024


def patch_record_limits() -> None:
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
            if size > limit:  # AWS's words (moto's RecordSizeExceedsLimit), with the stream's own limit
                raise JsonRESTError(
                    "ValidationException",
                    f"1 validation error detected: Value at 'records.{position}.member.data' failed to satisfy "
                    f"constraint: Member must have length less than or equal to {limit}",
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

    replace(Stream, "to_json_summary", to_json_summary)
    replace(kinesis_models.KinesisBackend, "put_records", put_records)
    replace(kinesis_models.KinesisBackend, "put_record", put_record)
    setattr(kinesis_responses.KinesisResponse, "update_max_record_size", update_max_record_size)  # noqa: B010 - an action moto lacks


def patch_record_distribution() -> None:
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

    replace(Stream, "to_json_summary", to_json_summary)
    replace(Stream, "get_shard_for_key", get_shard_for_key)
    setattr(  # noqa: B010 - an action moto lacks
        kinesis_responses.KinesisResponse,
        "update_stream_record_distribution_strategy",
        update_stream_record_distribution_strategy,
    )
