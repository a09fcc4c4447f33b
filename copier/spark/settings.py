"""The staging writer's settings and its errors (picklable: they cross to executors and back)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from copier.core.config import Config
from copier.core.errors import ConfigError, CopierError
from copier.core.limits import MAX_RECORD_BYTES

__all__ = ["InvalidRowError", "PutBudgetExhausted", "RecordTooLargeError", "WriterSettings"]


class RecordTooLargeError(CopierError):
    """A row whose record would exceed the Kinesis record limit: failing beats skipping it."""

    def __init__(self, event_id: str, size: int, limit: int = MAX_RECORD_BYTES) -> None:
        self.event_id, self.size, self.limit = event_id, size, limit
        super().__init__(
            f"event {event_id!r}: its record is {size} bytes (JSON payload + partition key), "
            f"over the Kinesis limit of {limit} bytes"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.event_id, self.size, self.limit)


class PutBudgetExhausted(CopierError):
    """PutRecords kept failing for some entries through every attempt: the task fails so Spark retries it."""

    def __init__(self, stream: str, attempts: int, records: int, failed: int, codes: Mapping[str, int]) -> None:
        self.stream, self.attempts, self.records, self.failed = stream, attempts, records, failed
        self.codes = dict(codes)
        detail = ", ".join(f"{code} x{n}" for code, n in sorted(self.codes.items()))
        super().__init__(
            f"PutRecords to {stream}: {failed} of {records} records still failing after {attempts} attempts "
            f"(last errors: {detail}); failing the task so Spark retries it"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.stream, self.attempts, self.records, self.failed, self.codes)


class InvalidRowError(CopierError):
    """A row that cannot become an event (null or empty ID or key, unconvertible value), with its position."""


@dataclass(frozen=True)
class WriterSettings:
    """Where and how rows are written; picklable, shipped to every task."""

    stream_name: str
    region: str
    endpoint: str | None = None
    id_column: str | None = None
    id_path: tuple[str, ...] = ("eventId",)
    partition_key_column: str | None = None
    aggregate: bool = False
    require_id: bool = False  # a row without a value at the dedup path fails (else it takes the derived ID)
    max_record_bytes: int = MAX_RECORD_BYTES  # the staging stream's record limit (MaxRecordSizeInKiB)
    max_attempts: int = 20
    max_backoff_ms: int = 10_000
    client_factory: Callable[[WriterSettings], Any] | None = None

    def __post_init__(self) -> None:
        if not self.stream_name or not self.id_path or not all(self.id_path):
            raise ValueError("stream_name and a non-empty id_path are required")
        if self.max_attempts < 1 or self.max_backoff_ms < 0:
            raise ValueError("max_attempts must be >= 1 and max_backoff_ms >= 0")

    @classmethod
    def from_config(cls, config: Config, **overrides: Any) -> WriterSettings:
        """Settings for the staging stream of a copier properties file, so writer and copier agree on the ID.

        ``copier.dedupKey = json:<path>`` puts the ID at that path. With
        ``partitionKey`` the copier takes the partition key as the ID, so the
        partition key must be the event ID (``partition_key_column`` None);
        the payload still carries it under ``eventId``.
        """
        key = config.dedup_key
        if key.kind == "partitionKey":
            if overrides.get("partition_key_column") is not None:
                raise ConfigError(
                    config.path,
                    "copier.dedupKey",
                    "is partitionKey: the event ID must be the partition key, so partition_key_column must be None",
                )
            id_path: tuple[str, ...] = ("eventId",)
        else:
            id_path = key.path
            if "id_path" in overrides and tuple(overrides["id_path"]) != key.path:
                raise ConfigError(config.path, "copier.dedupKey", f"is {key}, but id_path {overrides['id_path']}")
        fields: dict[str, Any] = {
            "stream_name": config.stream_name,
            "region": config.region,
            "endpoint": config.kinesis_endpoint,
            "id_path": id_path,
            "max_backoff_ms": config.max_backoff_millis,
        }
        fields.update(overrides)
        return cls(**fields)
