"""The PySpark staging writer: DataFrame rows to the staging stream, at-least-once, never lossy.

Spark retries a failed task, so a task may write some rows twice; that is
what the copier removes downstream. What this writer must guarantee is the
other half: every row lands at least once, carrying an event ID that is the
same on every write of that row, on the shard its duplicates will also
reach. So:

* each row becomes a JSON payload (the row as a dict, sorted keys, compact,
  UTF-8) with its event ID set at ``id_path``: the ``id_column``'s value as a
  string; without one, the value the row already has at ``id_path`` (never
  overwritten); without either, ``event_id_of(row)``, the SHA-256 hex digest
  of the row's canonical JSON (identical rows are then one event). A
  replayed micro-batch therefore writes the same IDs.
  A row whose ID or partition key is null or empty fails the task, naming
  the row's position, instead of being skipped;
* the partition key is the ``partition_key_column``'s value, or the event ID,
  so an event and its duplicates hash to the same shard. Kinesis caps keys at
  256 characters: a longer key is replaced by its SHA-256 hex digest (64
  characters), which is just as deterministic;
* PutRecords requests stay within the Kinesis limits (500 records, 5 MiB,
  1 MiB per record counting the partition key). A row too large for Kinesis
  raises :class:`RecordTooLargeError` naming its event ID and size. Failed
  entries (throughput, internal failure, KMS throttling), and whole requests
  that failed with throttling, a 5xx or a timeout, are retried with jittered
  backoff, only the failed entries; after ``max_attempts`` the task raises
  :class:`PutBudgetExhausted` and Spark retries the task. Nothing is dropped
  after a deadline, unlike the KPL-based connectors (their record TTL).
  Resending is fine on this side: duplicates are the copier's job;
* optionally (``aggregate``) small records are packed into KPL aggregated
  records (:mod:`copier.core.kpl`), grouped by the open shard their partition key
  hashes to (ListShards, once per DataFrame, on the driver), so a duplicate
  still lands on its original's shard. Every user record carries its
  aggregate's explicit hash key, so the KCL never discards one as out of its
  shard's range (see :mod:`copier.core.kpl`). Limit: the copier deduplicates per
  shard, and a child shard inherits its parents' windows but not its
  sibling's. Records grouped with shard ranges read before a reshard (a task
  retried within the same job reuses them) can land, inside an aggregate, on
  one child while other writes of the same event reach its sibling: such a
  duplicate can be forwarded twice. Avoid resharding while a job that
  aggregates is running, or leave ``aggregate`` off.

JSON conversion of Spark values (:func:`json_safe`): timestamps and dates as
ISO 8601 (aware datetimes converted to UTC; PySpark returns TimestampType
values as naive local times of the Python worker, so give executors one
time zone, e.g. ``TZ=UTC``, when derived IDs depend on timestamps),
day-time intervals as whole microseconds, decimals as exact strings
(``format(d, "f")``), binary as standard base64, NaN and infinities as the
strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, map keys as strings,
variants as their JSON.

pyspark is imported only inside functions: daemon hosts import copier
without it. What runs on executors is a module-level function bound with
:func:`functools.partial`, so copier must be importable there (installed, or
shipped with ``--py-files``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from copier.core.errors import FatalAwsError
from copier.core.shardmap import ShardMap
from copier.spark.put import RETRYABLE_ENTRY_CODES, default_client, make_client, open_shard_ranges, put_records, send
from copier.spark.rows import Entry, canonical_json, encode_row, event_id_of, json_safe, partition_key_of
from copier.spark.settings import InvalidRowError, PutBudgetExhausted, RecordTooLargeError, WriterSettings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "RETRYABLE_ENTRY_CODES",
    "Entry",
    "InvalidRowError",
    "PutBudgetExhausted",
    "RecordTooLargeError",
    "Tally",
    "WriterSettings",
    "canonical_json",
    "default_client",
    "encode_row",
    "event_id_of",
    "foreach_batch",
    "json_safe",
    "open_shard_ranges",
    "partition_key_of",
    "put_records",
    "write_dataframe",
    "write_partition",
]

log = logging.getLogger(__name__)

# Rows are encoded and sent in chunks, bounding executor memory; aggregation groups within a chunk.
_FLUSH_RECORDS = 20_000
_FLUSH_BYTES = 16 * 1024 * 1024


def _partition_id() -> int | None:
    try:
        from pyspark import TaskContext
    except ImportError:
        return None
    context = TaskContext.get()
    return None if context is None else int(context.partitionId())


def write_partition(
    settings: WriterSettings, ranges: ShardMap | None, rows: Iterable[Any], written: Any = None
) -> None:
    """Write one Spark partition's rows (runs on an executor, with a client of its own).

    Rows are encoded and sent in chunks; a bad or too large row raises before
    its chunk is sent, so nothing after an error is skipped silently: the
    task fails and its retry writes the partition again. ``written``: a Spark
    accumulator the rows landed are added to once all have (Spark applies a
    task's update of an action once, a retried task's only once).
    """
    partition = _partition_id()
    client = make_client(settings)
    chunk: list[Entry] = []
    size = 0
    count = 0
    for position, row in enumerate(rows):
        entry = encode_row(row, settings, position, partition)
        chunk.append(entry)
        size += len(entry.data)
        count = position + 1
        if len(chunk) >= _FLUSH_RECORDS or size >= _FLUSH_BYTES:
            send(client, settings, chunk, ranges)
            chunk, size = [], 0
    if chunk:
        send(client, settings, chunk, ranges)
    if written is not None:
        written.add(count)


@dataclass
class Tally:
    """What a writer has written, on the driver: rows landed and micro-batches (``copier produce``'s summary)."""

    records: int = 0
    batches: int = 0


def write_dataframe(df: DataFrame, settings: WriterSettings, tally: Tally | None = None) -> None:
    """Write a batch DataFrame to the staging stream; raises (the Spark job fails) unless every row landed."""
    for column in (settings.id_column, settings.partition_key_column):
        if column is not None and column not in df.columns:
            raise ValueError(f"no column {column!r} in the DataFrame (columns: {', '.join(df.columns)})")
    ranges = open_shard_ranges(make_client(settings), settings.stream_name) if settings.aggregate else None
    if ranges is not None and not ranges.ranges:
        raise FatalAwsError("ListShards", "NoOpenShards", f"{settings.stream_name} has no open shard")
    written = df.sparkSession.sparkContext.accumulator(0) if tally is not None else None
    df.foreachPartition(functools.partial(write_partition, settings, ranges, written=written))
    if tally is not None and written is not None:
        tally.records += written.value
        tally.batches += 1


def _write_batch(settings: WriterSettings, tally: Tally | None, df: DataFrame, batch_id: int) -> None:
    log.info("writing micro-batch %d to %s", batch_id, settings.stream_name)
    write_dataframe(df, settings, tally)


def foreach_batch(settings: WriterSettings, tally: Tally | None = None) -> Callable[[DataFrame, int], None]:
    """A function for ``df.writeStream.foreachBatch``: each micro-batch written with :func:`write_dataframe`.

    A micro-batch replayed after a failure carries the same event IDs
    (explicit or derived), so its duplicates are recognised downstream.
    """
    return functools.partial(_write_batch, settings, tally)
