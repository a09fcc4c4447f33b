"""``copier audit``: the exactly-once audit as a Spark job, for more events than one machine's memory holds.

``copier verify`` keeps every event ID in one Python process; this job
computes the same report (``copier.core.audittypes.AuditReport``: the same counts and
the same examples, in the same order) with Spark, over files:

* the produced IDs: manifest files, one ID per line, in production order
  (files in name order; an ID's production index is its first occurrence),
  and the records written without an ID, by their key and bytes
  (``{"eventId": null, "partitionKey": ..., "sha256": ...}``);
* the target's records: the files of ``copier export`` (JSON lines with the
  order the target holds them in, shard, sequence number, partition key and
  the record in base64), plain or gzip; or, with ``--format firehose``, the
  files a Kinesis Data Firehose delivery to S3 writes with a newline after
  each record (one record a line, nothing else: no partition key and no
  shard order, so out-of-order is not measured and reported as 0);
* optionally the dead-letter stream's records, in the same format, and
  what redrives sent on from it to the target (``--redriven``: the digest
  names ``copier export`` of the dead-letter stream keeps in its directory's
  ``_redriven.txt``, read from there when the directory is local). A
  dead-letter record a redrive sent is no copy of its own: its event's target
  copy is the delivery, by the rule ``copier verify`` and the chaos check
  decide by (``copier.core.audit.was_redriven``). Firehose files carry no
  partition key, so a redriven record without an event ID is not recognised
  there (its record's name includes the key): only keyed events are.

Event IDs are read from each record exactly as ``copier verify`` reads them
(the same Python functions, run in the executors). Out of order: per
partition key, in target order, a record produced before the
latest-produced record ahead of it (a window over each key, the running
maximum of production index). Records without an ID are counted per key and
bytes as ``copier verify`` counts them (``copier.core.audit``): the groups
are counted in Spark, and only the copies of those with more copies than
were produced come to the driver, where the same function as verify's
(``explain_unkeyed``) weighs them against the reports. In Firehose files
there is no key: such records are matched by their bytes alone, and a
report (which names a record by its key and bytes) can explain none of
their extra copies.
"""

from __future__ import annotations

import argparse
import base64
import json
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from copier.adapters.localkeys import command_config
from copier.core.audit import explain, explain_unkeyed
from copier.core.audittypes import AuditReport, DuplicateReport, OutOfOrder, Unkeyed, UnkeyedCopy, show
from copier.core.config import DedupKey
from copier.core.identity import EventValue

__all__ = ["add_arguments", "expand", "main", "run_audit"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--properties", required=True, metavar="FILE", help="the copier's properties file (dedupKey)")
    parser.add_argument(
        "--manifest", required=True, action="append", metavar="PATH", help="produced IDs (file or directory)"
    )
    parser.add_argument("--target", required=True, action="append", metavar="PATH", help="target files or directory")
    parser.add_argument("--dead-letter", action="append", metavar="PATH", help="dead-letter files or directory")
    parser.add_argument(
        "--redriven",
        action="append",
        metavar="FILE",
        help="what redrives sent (an export's _redriven.txt; read by itself from a local --dead-letter directory)",
    )
    parser.add_argument("--format", choices=["export", "firehose"], default="export", help="target file format")
    parser.add_argument("--examples", type=int, default=5, metavar="N", help="examples of each problem")
    parser.add_argument(
        "--reports", metavar="FILE", help="the copier's log lines: possible_duplicates lines excuse one copy each"
    )
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


def redriven_names(dead_letter: Iterable[str], files: Iterable[str]) -> set[str]:
    """What redrives sent: the names in ``files`` and in each local dead-letter directory's ``_redriven.txt``
    (``copier.adapters.shardfiles.REDRIVEN``, written by ``copier export``)."""
    from copier.adapters.shardfiles import REDRIVEN

    paths = [Path(f) for f in files]
    paths += [Path(d) / REDRIVEN for d in dead_letter if "://" not in d and (Path(d) / REDRIVEN).is_file()]
    return {line.strip() for p in paths for line in p.read_text(encoding="utf-8").splitlines() if line.strip()}


def _records(
    lines: Iterator[tuple[str, int]], key: DedupKey, fmt: str, dead_letter: bool, redriven: Collection[str] = ()
) -> Iterator[tuple[Any, ...]]:
    """One row per record of an export (or Firehose) file: (order, event key, partition key, shard, sequence
    number, SHA-256 of the bytes, arrival, problem, and for a record without an ID: its content_name, and the
    key and SHA-256 of what it delivers, and whether a redrive sent it on: a valid dead-letter record in
    ``redriven``, by ``copier.core.audit.was_redriven``). IDs are read as ``copier verify`` reads them, and kept
    as JSON text (an integer ID and its digits as a string stay apart). A dead-letter record is read as an
    envelope (``copier.core.auditinputs.read_envelope``): its event key is the original's, and ``problem`` says why it
    is not a valid envelope (None when it is). Firehose lines carry nothing but the record: their order is
    the line's, and they have no partition key, shard, sequence number or arrival."""
    from copier.core.audit import was_redriven
    from copier.core.auditinputs import event_id_in, read_envelope, sha256_hex
    from copier.core.audittypes import content_name, event_key
    from copier.core.deadlettercheck import check_dead_letter

    for line, number in lines:
        if not line.strip():
            continue
        if fmt == "export":
            doc = json.loads(line)
            order, pk, shard, seq = doc["order"], doc["partitionKey"], doc["shardId"], doc["sequenceNumber"]
            arrival = int(doc.get("arrival", 0))
            data = base64.b64decode(doc["data"])
        else:
            order, pk, shard, seq, arrival, data = number, "", "", "", 0, line.encode()
        digest = sha256_hex(data)
        delivers: tuple[str | None, str | None] = (pk if fmt == "export" else None, digest)
        sent = False  # a target record, or a dead-letter record no redrive sent
        if dead_letter:
            letter = read_envelope(key, shard, {"SequenceNumber": seq, "Data": data, "PartitionKey": pk})
            event_id, problem = letter.event_id, check_dead_letter(letter)
            delivers = (letter.partition_key, letter.sha256)
            sent = problem is None and was_redriven(letter, event_id, redriven)
        else:
            event_id, problem = event_id_in(key, pk, data), None
        found = None if event_id is None else event_key(event_id)
        name = content_name(pk, data) if event_id is None and fmt == "export" else None
        yield order, found, pk, shard, seq, digest, arrival, problem, name, *delivers, sent


_SCHEMA = (
    "order long, event_id string, partition_key string, shard_id string, sequence_number string, "
    "sha256 string, arrival long, problem string, content string, group_pk string, group_sha string, "
    "redriven boolean"
)


def _manifest_rows(lines: Iterator[tuple[str, int]]) -> Iterator[tuple[Any, ...]]:
    """(position, event key or None for a record without an ID, partition key or None, SHA-256 or None) per
    manifest line (copier.commands.verify's format)."""
    from copier.core.auditinputs import manifest_entry
    from copier.core.audittypes import event_key

    for line, position in lines:
        entry = manifest_entry(line, position)
        if entry is not None:
            found = None if entry.event_id is None else event_key(entry.event_id)
            yield position, found, entry.partition_key, entry.sha256


def _value(key: str) -> EventValue:
    """An event key (JSON text) back as the event ID."""
    value = json.loads(key)
    assert isinstance(value, str | int)
    return value


def run_audit(
    spark: Any,
    key: DedupKey,
    manifest: Sequence[str],
    target: Sequence[str],
    dead_letter: Sequence[str] | None,
    fmt: str = "export",
    examples: int = 5,
    reports: Sequence[DuplicateReport] = (),
    redriven: Collection[str] = frozenset(),
) -> AuditReport:
    """The report for these files; see the module docstring. ``redriven``: the digest names of what redrives
    sent (:func:`redriven_names`), sent to the executors once (a broadcast)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    sc = spark.sparkContext
    lines = sc.textFile(",".join(expand(manifest))).zipWithIndex()
    rows = spark.createDataFrame(
        lines.mapPartitions(_manifest_rows), "position long, event_id string, pk string, sha string"
    ).cache()
    listed = rows.where(F.col("event_id").isNotNull())
    occurrences = listed.count()
    produced = listed.groupBy("event_id").agg(F.min("position").alias("index"), F.first("pk", True).alias("pk"))
    produced = produced.cache()
    versions = listed.where(F.col("pk").isNotNull() | F.col("sha").isNotNull()).select("event_id", "pk", "sha")

    sent = sc.broadcast(frozenset(redriven))

    def read(paths: Sequence[str], dead: bool) -> Any:
        numbered = sc.textFile(",".join(expand(paths))).zipWithIndex()
        rows = numbered.mapPartitions(lambda part: _records(part, key, fmt, dead, sent.value))
        return spark.createDataFrame(rows, _SCHEMA)

    records = read(target, False).cache()
    found = records.count()
    keyed = records.where(F.col("event_id").isNotNull())
    copies_df = keyed.select("event_id", "order", "arrival")

    dead_letter_records = invalid = redriven_letters = 0
    invalid_examples: tuple[str, ...] = ()
    dead_ids = spark.createDataFrame([], "event_id string")
    dead_df = None
    if dead_letter:
        dead_df = read(dead_letter, True).cache()
        dead_letter_records = dead_df.count()
        bad = dead_df.where(F.col("problem").isNotNull())
        invalid = bad.count()
        invalid_examples = tuple(
            f"{r.shard_id}@{r.sequence_number}: {r.problem}" for r in bad.orderBy("order").limit(examples).collect()
        )
        redriven_letters = dead_df.where(F.col("redriven")).count()
        valid = dead_df.where(F.col("problem").isNull() & F.col("event_id").isNotNull() & ~F.col("redriven"))
        dead_ids = valid.select("event_id").distinct()
        copies_df = copies_df.unionByName(valid.select("event_id", F.lit(None).cast("long").alias("order"), "arrival"))
    copies = copies_df.groupBy("event_id").agg(
        F.count("*").alias("n"), F.min("order").alias("first"), F.collect_list("arrival").alias("arrivals")
    )
    copies = copies.cache()

    def ids(df: Any, order: str) -> tuple[int, tuple[EventValue, ...]]:
        return df.count(), tuple(_value(r.event_id) for r in df.orderBy(order).limit(examples).collect())

    lost, lost_examples = ids(produced.join(copies, "event_id", "left_anti"), "index")
    dead_lettered, dead_lettered_examples = ids(produced.join(dead_ids, "event_id", "left_semi"), "index")
    in_target = keyed.select("event_id").distinct()
    unexpected, unexpected_examples = ids(
        copies.join(produced, "event_id", "left_anti").join(in_target, "event_id", "left_semi"), "first"
    )
    doubles = copies.where(F.col("n") > 1).cache()
    duplicated = doubles.count()
    extra = int(doubles.agg(F.sum(F.col("n") - 1)).first()[0] or 0)
    duplicated_examples = tuple((_value(r.event_id), r.n) for r in doubles.orderBy("first").limit(examples).collect())
    arrivals = {_value(r.event_id): list(r.arrivals) for r in doubles.select("event_id", "arrivals").collect()}
    explained, unexplained = explain(arrivals, reports)

    matched = keyed.join(versions, "event_id").withColumn(
        "match",
        (
            (F.col("pk").isNull() | (F.col("pk") == F.col("partition_key")))
            & (F.col("sha").isNull() | (F.col("sha") == F.col("sha256")))
        ).cast("int"),
    )
    changed_df = matched.groupBy("order", "event_id", "shard_id", "sequence_number").agg(F.max("match").alias("m"))
    changed_df = changed_df.where(F.col("m") == 0)
    changed = changed_df.count()
    changed_examples = tuple(
        f"{show(_value(r.event_id))} at {r.shard_id}@{r.sequence_number}"
        for r in changed_df.orderBy("order").limit(examples).collect()
    )

    unkeyed_df = records.where(F.col("event_id").isNull())
    unkeyed = unkeyed_df.count()
    without_id = _without_id(rows, unkeyed_df, dead_df, fmt, examples, reports)
    unkeyed_examples = tuple(
        Unkeyed(r.shard_id, r.sequence_number, r.partition_key)
        for r in unkeyed_df.orderBy("order").limit(examples).collect()
    )

    out_of_order, out_of_order_examples = 0, tuple[OutOfOrder, ...]()
    if fmt == "export":
        first = keyed.groupBy("event_id").agg(F.min("order").alias("order"))  # a duplicate's later copy aside
        placed = (
            first.join(keyed.select("event_id", "order", "partition_key"), ["event_id", "order"])
            .join(produced, "event_id")
            .withColumn("key", F.coalesce(F.col("pk"), F.col("partition_key")))
        )
        window = Window.partitionBy("key").orderBy("order").rowsBetween(Window.unboundedPreceding, -1)
        placed = placed.withColumn("ahead", F.max(F.struct("index", "event_id")).over(window))
        late = placed.where(F.col("ahead").isNotNull() & (F.col("index") < F.col("ahead.index")))
        out_of_order = late.count()
        out_of_order_examples = tuple(
            OutOfOrder(_value(r.event_id), r.key, _value(r.ahead.event_id))
            for r in late.orderBy("order").limit(examples).collect()
        )
    return AuditReport(
        expected=produced.count(),
        produced=occurrences,
        found=found,
        dead_letter_records=dead_letter_records,
        redriven=redriven_letters,
        lost=lost,
        duplicated=duplicated,
        extra_copies=extra,
        unexpected=unexpected,
        unkeyed=unkeyed,
        dead_lettered=dead_lettered,
        out_of_order=out_of_order,
        explained_copies=explained,
        unexplained_copies=extra - explained,
        reports=len(reports),
        reported_ids=sum(len(set(r.event_ids)) for r in reports),
        reported_unkeyed=sum(len(r.unkeyed) for r in reports),
        **without_id,
        changed=changed,
        invalid_dead_letters=invalid,
        lost_examples=lost_examples,
        duplicated_examples=duplicated_examples,
        unexplained_examples=tuple(unexplained[:examples]),
        unexpected_examples=unexpected_examples,
        unkeyed_examples=unkeyed_examples,
        dead_lettered_examples=dead_lettered_examples,
        out_of_order_examples=out_of_order_examples,
        changed_examples=changed_examples,
        invalid_dead_letter_examples=invalid_examples,
    )


def _without_id(
    rows: Any, unkeyed_df: Any, dead_df: Any, fmt: str, examples: int, reports: Sequence[DuplicateReport]
) -> dict[str, Any]:
    """The report's counts of records without an ID (``copier.core.audit``'s rules for a manifest, which has no
    staging positions): produced and copies counted per key and bytes in Spark; the copies of the groups with
    more copies than were produced weighed on the driver, by the function verify uses."""
    from pyspark.sql import functions as F

    def group_key(pk: Any, sha: Any) -> list[Any]:
        bare = F.lit(None).cast("string") if fmt != "export" else F.coalesce(pk, F.lit(""))
        return [bare.alias("gpk"), sha.alias("gsha")]

    made = rows.where(F.col("event_id").isNull()).select(*group_key(F.col("pk"), F.col("sha")))
    spot = F.concat(F.col("shard_id"), F.lit("@"), F.col("sequence_number"))
    where = F.concat(spot, F.lit(" (partition key "), F.col("partition_key"), F.lit(")"))
    copies = unkeyed_df.select(
        *group_key(F.col("group_pk"), F.col("group_sha")), "arrival", "content", where.alias("w")
    )
    if dead_df is not None:
        letters = dead_df.where(F.col("problem").isNull() & F.col("event_id").isNull() & ~F.col("redriven"))
        where = F.concat(spot, F.lit(" (dead-letter stream)"))
        copies = copies.unionByName(
            letters.select(*group_key(F.col("group_pk"), F.col("group_sha")), "arrival", "content", where.alias("w"))
        )
    copies = copies.cache()
    produced_n = made.groupBy("gpk", "gsha").agg(F.count("*").alias("n")).alias("a")
    copies_m = copies.groupBy("gpk", "gsha").agg(F.count("*").alias("m")).alias("b")
    on = F.col("a.gpk").eqNullSafe(F.col("b.gpk")) & F.col("a.gsha").eqNullSafe(F.col("b.gsha"))
    counted = (
        produced_n.join(copies_m, on, "full_outer")
        .select(
            F.coalesce(F.col("a.gpk"), F.col("b.gpk")).alias("gpk"),
            F.coalesce(F.col("a.gsha"), F.col("b.gsha")).alias("gsha"),
            F.coalesce(F.col("n"), F.lit(0)).alias("n"),
            F.coalesce(F.col("m"), F.lit(0)).alias("m"),
        )
        .cache()
    )
    sums = counted.agg(
        F.sum("n").alias("expected"),
        F.sum(F.when(F.col("n") > F.col("m"), F.col("n") - F.col("m")).otherwise(0)).alias("lost"),
        F.sum(F.when(F.col("n") == 0, F.col("m")).otherwise(0)).alias("unexpected"),
    ).first()
    over = counted.where((F.col("n") > 0) & (F.col("m") > F.col("n"))).alias("o")
    on = F.col("o.gpk").eqNullSafe(F.col("c.gpk")) & F.col("o.gsha").eqNullSafe(F.col("c.gsha"))
    grouped: dict[tuple[str | None, str | None], tuple[int, list[UnkeyedCopy]]] = {}
    for r in (
        over.join(copies.alias("c"), on).select("c.gpk", "c.gsha", "o.n", "c.arrival", "c.content", "c.w").collect()
    ):
        group = grouped.setdefault((r.gpk, r.gsha), (r.n, []))
        group[1].append(UnkeyedCopy(r.arrival, r.content, r.w))
    extra = {g: sorted(c, key=lambda copy: copy.order)[n:] for g, (n, c) in grouped.items()}
    names = {g: [copy.content for copy in c] for g, (_, c) in grouped.items()}
    explained, unexplained = explain_unkeyed(extra, names, reports)
    lost = int(sums.lost or 0)
    return {
        "unkeyed_expected": int(sums.expected or 0),
        "unkeyed_lost": lost,
        "unkeyed_extra_copies": sum(len(c) for c in extra.values()),
        "unkeyed_explained": explained,
        "unkeyed_unexplained": len(unexplained),
        "unkeyed_unexpected": int(sums.unexpected or 0),
        "unkeyed_lost_examples": ("?",) * min(lost, examples),  # a manifest has no staging positions
        "unkeyed_unexplained_examples": tuple(c.where for c in unexplained[:examples]),
    }


def main(args: argparse.Namespace) -> int:
    """``copier audit``: 0 exactly once, 1 lost or duplicated events; the report on stdout like verify's."""
    import os
    import sys
    from contextlib import AbstractContextManager, nullcontext

    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    from copier.core.auditinputs import read_reports
    from copier.core.verifyreport import VerifyResult, render_json, render_text
    from copier.spark.progress import StageLines, console_bar

    config = command_config(args.properties)
    reports = read_reports(args.reports) if args.reports else []
    bar = console_bar()  # Spark's own bar on a terminal; whole lines in a log (copier.spark.progress)
    builder = SparkSession.builder.appName("copier-audit").config("spark.ui.showConsoleProgress", str(bar).lower())
    if args.master or not SparkConf().contains("spark.master"):  # run directly, not by spark-submit
        builder = builder.master(args.master or "local[*]")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import copier (see copier produce)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    progress: AbstractContextManager[object] = nullcontext() if bar else StageLines(spark.sparkContext.statusTracker())
    try:
        with progress:
            report = run_audit(
                spark,
                config.dedup_key,
                args.manifest,
                args.target,
                args.dead_letter,
                args.format,
                args.examples,
                reports,
                redriven_names(args.dead_letter or [], args.redriven or []),
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
