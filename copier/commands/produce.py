"""``copier produce``: the PySpark job that writes a directory of JSON lines to the staging stream.

A Structured Streaming file source reads the directory (new files are
picked up as they arrive) with a checkpoint location, and every micro-batch
is written by :func:`copier.spark.foreach_batch`. The delivery is
at-least-once by design: a micro-batch interrupted mid-write is written
again when the query restarts from its checkpoint, with the same event IDs,
and the copier removes those duplicates downstream.

Settings that matter on a cluster: ``spark.speculation`` stays false (a
speculative task writes its rows a second time), and ``spark.task.maxFailures``
decides how often a task whose puts ran out of retries is tried again
before the query fails.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from copier.adapters.localkeys import command_config
from copier.core.config import Config
from copier.core.limits import MAX_RECORD_BYTES

if TYPE_CHECKING:
    from copier.spark import Tally, WriterSettings

__all__ = ["add_arguments", "build_query", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--properties", required=True, metavar="FILE", help="staging stream, region, endpoint, dedupKey"
    )
    parser.add_argument("--input", required=True, metavar="DIR", help="directory of JSON-lines files")
    parser.add_argument("--checkpoint", required=True, metavar="DIR", help="the query's checkpoint location")
    parser.add_argument(
        "--schema", metavar="DDL", help="the files' schema (default: inferred from the files there now)"
    )
    parser.add_argument(
        "--id-column",
        metavar="COL",
        help="column holding the event ID; a null or empty value fails the task (InvalidRowError). Default: the "
        "row's field at the dedup path if it has a value there, else a SHA-256 of the row (identical rows are "
        "one event)",
    )
    parser.add_argument(
        "--require-id",
        action="store_true",
        help="without --id-column: a row with no value at the dedup path (absent or null) fails the task "
        "(InvalidRowError) instead of taking the derived ID",
    )
    parser.add_argument("--partition-key-column", metavar="COL", help="partition key column (default: the event ID)")
    parser.add_argument("--aggregate", action="store_true", help="pack small events into KPL aggregated records")
    parser.add_argument("--partitions", type=int, metavar="N", help="repartition each micro-batch into N writers")
    parser.add_argument("--max-files-per-trigger", type=int, default=100, metavar="N")
    parser.add_argument("--once", action="store_true", help="process the files there now, then stop (availableNow)")
    parser.add_argument("--trigger-seconds", type=float, default=5.0, metavar="S", help="micro-batch interval")
    parser.add_argument("--master", help="Spark master when not run by spark-submit (default: local[*, 4])")


def _session(master: str | None) -> Any:
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("copier-produce").config("spark.speculation", "false")
    if master or not SparkConf().contains("spark.master"):
        # run directly, not by spark-submit: local mode, a failed task tried up to 4 times as on a cluster
        builder = builder.master(master or "local[*, 4]")
        if not os.environ.get("PYSPARK_PYTHON"):
            # Python workers run `python3` from PATH by default (SparkContext reads PYSPARK_PYTHON, not
            # spark.pyspark.python), which need not have copier or pyspark: started outside the source
            # tree they fail with ModuleNotFoundError. In local mode they are this interpreter's.
            os.environ["PYSPARK_PYTHON"] = sys.executable
    return builder.getOrCreate()


def staging_record_limit(settings: WriterSettings) -> int:
    """The staging stream's own record limit (MaxRecordSizeInKiB, up to 10 MiB), read once by the driver with
    the writer's own client (a cluster's Python may have only pyspark and boto3); Kinesis' default (1 MiB)
    when it cannot be read (a larger record then fails its row, never silently)."""
    import botocore.exceptions

    from copier.core.streamsettings import StreamSettings
    from copier.spark.put import make_client

    try:
        answer = make_client(settings).describe_stream_summary(StreamName=settings.stream_name)
        return StreamSettings.from_summary(settings.stream_name, answer["StreamDescriptionSummary"]).max_record_bytes
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        sys.stderr.write(f"copier: warning: the staging stream's record limit cannot be read ({exc}): 1 MiB\n")
        return MAX_RECORD_BYTES


def build_query(spark: Any, args: argparse.Namespace, config: Config, tally: Tally | None = None) -> Any:
    """The streaming query, not yet started: file source -> foreach_batch writer (counting into ``tally``)."""
    from copier.spark import WriterSettings, foreach_batch

    settings = WriterSettings.from_config(
        config,
        id_column=args.id_column,
        partition_key_column=args.partition_key_column,
        aggregate=args.aggregate,
        require_id=args.require_id,
    )
    settings = replace(settings, max_record_bytes=staging_record_limit(settings))
    schema = args.schema or spark.read.json(args.input).schema
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", args.max_files_per_trigger).json(args.input)
    write = foreach_batch(settings, tally)
    if args.partitions:
        partitions = args.partitions

        def write(df: Any, batch_id: int, _inner: Any = write) -> None:
            _inner(df.repartition(partitions), batch_id)

    writer = stream.writeStream.foreachBatch(write).option("checkpointLocation", args.checkpoint)
    if args.once:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{args.trigger_seconds} seconds")


def main(args: argparse.Namespace) -> int:
    # Read before Spark starts: its JVM and Python workers inherit the dummy keys of a local run (their
    # environment is fixed when they start), which sign the workers' puts (copier.adapters.localkeys).
    config = command_config(args.properties)
    from copier.spark import Tally

    spark = _session(args.master)
    tally = Tally()
    try:
        query = build_query(spark, args, config, tally).start()
        query.awaitTermination()
    finally:
        spark.stop()
    sys.stderr.write(summary(tally, config.stream_name) + "\n")
    return 0


def summary(tally: Tally, stream: str) -> str:
    """The one line a finished run prints. Duplicates written on purpose (a micro-batch written again after a
    restart from the checkpoint) are among the records: the writer cannot tell a replayed batch's rows from new
    ones, and the copier drops them downstream."""
    batches = "micro-batch" if tally.batches == 1 else "micro-batches"
    records = "record" if tally.records == 1 else "records"
    return f"produce: {tally.records} {records} written to {stream} in {tally.batches} {batches}"
