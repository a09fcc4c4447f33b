"""``copier audit``: the exactly-once audit as a Spark job, for more events than one machine's memory holds.

``copier verify`` keeps every event ID in one Python process; this job
computes the same report (``copier.audit.AuditReport``: the same counts and
the same examples, in the same order) with Spark, over files:

* the produced IDs: manifest files, one ID per line, in production order
  (files in name order; an ID's production index is its first occurrence);
* the target's records: the files of ``copier export`` (JSON lines with the
  order the target holds them in, shard, sequence number, partition key and
  the record in base64), plain or gzip; or, with ``--format firehose``, the
  files a Kinesis Data Firehose delivery to S3 writes with a newline after
  each record (one record a line, nothing else: no partition key and no
  shard order, so out-of-order is not measured and reported as 0);
* optionally the dead-letter stream's records, in the same format.

Event IDs are read from each record exactly as ``copier verify`` reads them
(the same Python functions, run in the executors). Out of order: per
partition key, in target order, a record produced before the
latest-produced record ahead of it (a window over each key, the running
maximum of production index).
"""

from __future__ import annotations

import argparse
import base64
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from copier.audit import AuditReport, OutOfOrder, Unkeyed
from copier.config import DedupKey, load_config

__all__ = ["add_arguments", "expand", "main", "run_audit"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--properties", required=True, metavar="FILE", help="the copier's properties file (dedupKey)")
    parser.add_argument(
        "--manifest", required=True, action="append", metavar="PATH", help="produced IDs (file or directory)"
    )
    parser.add_argument("--target", required=True, action="append", metavar="PATH", help="target files or directory")
    parser.add_argument("--dead-letter", action="append", metavar="PATH", help="dead-letter files or directory")
    parser.add_argument("--format", choices=["export", "firehose"], default="export", help="target file format")
    parser.add_argument("--examples", type=int, default=5, metavar="N", help="examples of each problem")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the text report")
    parser.add_argument("--master", help="Spark master when not run by spark-submit (default: local[*])")


def expand(paths: Iterable[str]) -> list[str]:
    """Local directories become their files in name order; anything else (s3://..., files) stays as given."""
    out: list[str] = []
    for path in paths:
        local = Path(path)
        if "://" not in path and local.is_dir():
            out.extend(str(p) for p in sorted(local.rglob("*")) if p.is_file() and not p.name.startswith((".", "_")))
        else:
            out.append(path)
    return out


def _records(lines: Iterator[tuple[str, int]], key: DedupKey, fmt: str, dead_letter: bool) -> Iterator[tuple[Any, ...]]:
    """(order, event ID or None, partition key, shard, sequence number) for each (line, line number),
    the ID read as ``copier verify`` reads it. Firehose lines carry nothing but the record: their order is
    the line's, and they have no partition key, shard or sequence number."""
    from copier.verify import dead_letter_event_id, event_id_in

    for line, number in lines:
        if not line.strip():
            continue
        if fmt == "export":
            doc = json.loads(line)
            order, pk, shard, seq = doc["order"], doc["partitionKey"], doc["shardId"], doc["sequenceNumber"]
            data = base64.b64decode(doc["data"])
        else:
            order, pk, shard, seq, data = number, "", "", "", line.encode()
        event_id = dead_letter_event_id(key, pk, data) if dead_letter else event_id_in(key, pk, data)
        yield order, event_id, pk, shard, seq


_SCHEMA = "order long, event_id string, partition_key string, shard_id string, sequence_number string"


def run_audit(
    spark: Any,
    key: DedupKey,
    manifest: Sequence[str],
    target: Sequence[str],
    dead_letter: Sequence[str] | None,
    fmt: str = "export",
    examples: int = 5,
) -> AuditReport:
    """The report for these files; see the module docstring."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    sc = spark.sparkContext
    lines = sc.textFile(",".join(expand(manifest))).map(str.strip).filter(bool)
    indexed = lines.zipWithIndex().toDF("event_id string, position long")
    occurrences = indexed.count()
    produced = indexed.groupBy("event_id").agg(F.min("position").alias("index")).cache()

    def read(paths: Sequence[str], dead: bool) -> Any:
        numbered = sc.textFile(",".join(expand(paths))).zipWithIndex()
        return spark.createDataFrame(numbered.mapPartitions(lambda part: _records(part, key, fmt, dead)), _SCHEMA)

    records = read(target, False).cache()
    found = records.count()
    keyed = records.where(F.col("event_id").isNotNull())
    copies = keyed.groupBy("event_id").agg(F.count("*").alias("n"), F.min("order").alias("first")).cache()

    dead_ids = spark.createDataFrame([], "event_id string")
    dead_letter_records = 0
    if dead_letter:
        dead_df = read(dead_letter, True).cache()
        dead_letter_records = dead_df.count()
        dead_ids = dead_df.where(F.col("event_id").isNotNull()).select("event_id").distinct()

    def ids(df: Any, order: str) -> tuple[int, tuple[str, ...]]:
        return df.count(), tuple(r.event_id for r in df.orderBy(order).limit(examples).collect())

    lost, lost_examples = ids(
        produced.join(copies, "event_id", "left_anti").join(dead_ids, "event_id", "left_anti"), "index"
    )
    dead_lettered, dead_lettered_examples = ids(produced.join(dead_ids, "event_id", "left_semi"), "index")
    unexpected, unexpected_examples = ids(copies.join(produced, "event_id", "left_anti"), "first")
    doubles = copies.where(F.col("n") > 1)
    duplicated = doubles.count()
    extra = doubles.agg(F.sum(F.col("n") - 1)).first()[0] or 0
    duplicated_examples = tuple((r.event_id, r.n) for r in doubles.orderBy("first").limit(examples).collect())
    unkeyed_df = records.where(F.col("event_id").isNull())
    unkeyed = unkeyed_df.count()
    unkeyed_examples = tuple(
        Unkeyed(r.shard_id, r.sequence_number, r.partition_key)
        for r in unkeyed_df.orderBy("order").limit(examples).collect()
    )

    out_of_order, out_of_order_examples = 0, tuple[OutOfOrder, ...]()
    if fmt == "export":
        window = Window.partitionBy("partition_key").orderBy("order").rowsBetween(Window.unboundedPreceding, -1)
        placed = keyed.join(produced, "event_id").withColumn("ahead", F.max(F.struct("index", "event_id")).over(window))
        late = placed.where(F.col("ahead").isNotNull() & (F.col("index") < F.col("ahead.index")))
        out_of_order = late.count()
        out_of_order_examples = tuple(
            OutOfOrder(r.event_id, r.partition_key, r.ahead.event_id)
            for r in late.orderBy("order").limit(examples).collect()
        )
    return AuditReport(
        expected=produced.count(),
        produced=occurrences,
        found=found,
        dead_letter_records=dead_letter_records,
        lost=lost,
        duplicated=duplicated,
        extra_copies=int(extra),
        unexpected=unexpected,
        unkeyed=unkeyed,
        dead_lettered=dead_lettered,
        out_of_order=out_of_order,
        lost_examples=lost_examples,
        duplicated_examples=duplicated_examples,
        unexpected_examples=unexpected_examples,
        unkeyed_examples=unkeyed_examples,
        dead_lettered_examples=dead_lettered_examples,
        out_of_order_examples=out_of_order_examples,
    )


def main(args: argparse.Namespace) -> int:
    """``copier audit``: 0 exactly once, 1 lost or duplicated events; the report on stdout like verify's."""
    import os
    import sys

    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    from copier.verify import VerifyResult, render_json, render_text

    config = load_config(args.properties)
    builder = SparkSession.builder.appName("copier-audit")
    if args.master or not SparkConf().contains("spark.master"):  # run directly, not by spark-submit
        builder = builder.master(args.master or "local[*]")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import copier (see copier produce)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        report = run_audit(
            spark, config.dedup_key, args.manifest, args.target, args.dead_letter, args.format, args.examples
        )
    finally:
        spark.stop()
    result = VerifyResult(
        report=report,
        source="manifest",
        source_records=report.produced,
        source_unkeyed=0,
        target_stream=", ".join(args.target),
        dead_letter_stream=", ".join(args.dead_letter) if args.dead_letter else None,
    )
    text = render_json(result) if args.json else render_text(result).replace("verify:", "audit:")
    print(text)
    return 0 if result.ok else 1
