"""The PySpark staging writer (copier.spark): row encoding, retries, and real Spark jobs on the local backend."""

from __future__ import annotations

import base64
import functools
import json
import os
import shutil
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest

from copier.commands import produce
from copier.core import kpl
from copier.core.config import parse_config
from copier.core.errors import ConfigError, FatalAwsError
from copier.spark import (
    InvalidRowError,
    PutBudgetExhausted,
    RecordTooLargeError,
    Tally,
    WriterSettings,
    encode_row,
    event_id_of,
    foreach_batch,
    put_records,
    write_dataframe,
)
from copier.testing import FlakyKinesis, flaky_kinesis, read_flaky_log
from tests.support.backend import client, create_stream, read_stream

REGION = "us-east-1"


def _settings(**kw: Any) -> WriterSettings:
    return WriterSettings(**{"stream_name": "s", "region": REGION, **kw})


# --- encoding rows (no Spark needed) --------------------------------------------------------------


def test_row_becomes_json_with_the_id_at_its_path() -> None:
    """The payload is the row as sorted compact JSON with the ID set at id_path, nested objects created."""
    import datetime as dt
    import decimal

    row = {
        "id": 17,
        "amount": decimal.Decimal("1.50"),
        "day": dt.date(2024, 1, 2),
        "raw": b"\x00\x01",
        "nan": float("nan"),
    }
    entry = encode_row(row, _settings(id_column="id", id_path=("meta", "eventId")), position=0)
    assert entry.event_id == "17" and entry.partition_key == "17"
    assert json.loads(entry.data) == {
        "id": 17,
        "amount": "1.50",
        "day": "2024-01-02",
        "raw": base64.b64encode(b"\x00\x01").decode(),
        "nan": "NaN",
        "meta": {"eventId": "17"},
    }
    assert entry.data == json.dumps(json.loads(entry.data), sort_keys=True, separators=(",", ":")).encode()


def test_derived_id_is_the_sha256_of_canonical_json() -> None:
    """Without id_column the ID is event_id_of(row), a SHA-256 of the row's canonical JSON, the same every time."""
    row = {"b": [1, 2], "a": "é"}
    entry = encode_row(row, _settings(), position=0)
    import hashlib

    assert entry.event_id == event_id_of(row) == hashlib.sha256('{"a":"é","b":[1,2]}'.encode()).hexdigest()
    assert encode_row(dict(reversed(list(row.items()))), _settings(), position=5).event_id == entry.event_id


def test_an_id_the_row_already_carries_at_the_dedup_path_is_its_id() -> None:
    """Without id_column, a row with a value at the dedup path keeps it as its ID (never overwritten by a
    derived one); a null there (Spark reads a column some rows lack as null) takes the derived ID, as a row
    without the field does, the same in every run; with require_id both fail the task naming the row."""
    entry = encode_row({"eventId": "abc", "n": 1}, _settings(), position=0)
    assert (entry.event_id, json.loads(entry.data)["eventId"]) == ("abc", "abc")
    nested = encode_row({"meta": {"id": 42}, "n": 1}, _settings(id_path=("meta", "id")), position=0)
    assert nested.event_id == "42"
    null = encode_row({"eventId": None, "n": 1}, _settings(), position=2)
    assert (
        null.event_id
        == event_id_of({"eventId": None, "n": 1})
        == encode_row({"eventId": None, "n": 1}, _settings(), 9).event_id
    )
    assert json.loads(null.data)["eventId"] == null.event_id
    for row in ({"eventId": None, "n": 1}, {"n": 1}):
        with pytest.raises(InvalidRowError, match=r"row 2: the row has no eventId \(the dedup path\), and an ID is"):
            encode_row(row, _settings(require_id=True), position=2)
    identical = [encode_row({"n": 1}, _settings(), position=i).event_id for i in range(2)]
    assert identical[0] == identical[1] == event_id_of({"n": 1}), "identical rows are one event"


def test_null_or_empty_id_fails_naming_the_row() -> None:
    """A null or empty id_column value is an error naming the row position, never a silent skip."""
    for bad in (None, ""):
        with pytest.raises(InvalidRowError, match="row 3 of partition 1: the ID column 'id' is"):
            encode_row({"id": bad}, _settings(id_column="id"), position=3, partition=1)


def test_partition_keys_over_256_chars_are_hashed_and_empty_ones_rejected() -> None:
    """A long partition key becomes its SHA-256 hex; an empty one is an error."""
    import hashlib

    long_key = "k" * 300
    entry = encode_row({"id": "e", "pk": long_key}, _settings(id_column="id", partition_key_column="pk"), 0)
    assert entry.partition_key == hashlib.sha256(long_key.encode()).hexdigest()
    with pytest.raises(InvalidRowError, match="partition key column 'pk' is empty"):
        encode_row({"id": "e", "pk": ""}, _settings(id_column="id", partition_key_column="pk"), 0)


def test_too_large_row_names_the_event_and_size() -> None:
    """A record over 1 MiB raises RecordTooLargeError with the event ID and its size."""
    with pytest.raises(RecordTooLargeError, match=r"event 'big-1': its record is 1100\d\d\d bytes"):
        encode_row({"id": "big-1", "body": "x" * 1_100_000}, _settings(id_column="id"), 0)


class _ScriptedClient:
    """Answers PutRecords from a script: an exception, or per-entry error codes."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.calls: list[int] = []

    def put_records(self, StreamName: str, Records: list[dict[str, Any]]) -> dict[str, Any]:  # noqa: N803
        self.calls.append(len(Records))
        step = self.script.pop(0) if self.script else None
        if isinstance(step, Exception):
            raise step
        codes = step or [None] * len(Records)
        return {"Records": [{"ErrorCode": c} if c else {"SequenceNumber": "1", "ShardId": "s"} for c in codes]}


def _records(n: int) -> list[kpl.KinesisRecord]:
    return [kpl.KinesisRecord(f"k{i}", None, b"{}") for i in range(n)]


def test_only_failed_entries_are_resent_and_whole_request_failures_retried() -> None:
    """A 503 resends the request; per-entry throttling resends only those entries."""
    throttled = botocore.exceptions.ClientError(
        {"Error": {"Code": "ServiceUnavailable"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutRecords"
    )
    fake = _ScriptedClient([throttled, ["ProvisionedThroughputExceededException", None, "InternalFailure", None]])
    attempts = put_records(fake, _settings(max_backoff_ms=0), _records(4), sleep=lambda s: None)
    assert attempts == 3 and fake.calls == [4, 4, 2]


def test_budget_exhaustion_raises_with_counts_and_codes() -> None:
    """After max_attempts the put raises PutBudgetExhausted naming the counts and the last error codes."""
    fake = _ScriptedClient([["KMSThrottlingException", None], ["KMSThrottlingException"], ["KMSThrottlingException"]])
    with pytest.raises(PutBudgetExhausted, match=r"1 of 2 records still failing after 3 attempts.*KMSThrottling"):
        put_records(fake, _settings(max_attempts=3, max_backoff_ms=0), _records(2), sleep=lambda s: None)


def test_non_retryable_failures_fail_at_once() -> None:
    """A missing stream or a KMS access error cannot succeed by waiting: FatalAwsError on the first attempt."""
    missing = botocore.exceptions.ClientError({"Error": {"Code": "ResourceNotFoundException"}}, "PutRecords")
    for step in (missing, ["KMSAccessDeniedException"]):
        fake = _ScriptedClient([step])
        with pytest.raises(FatalAwsError):
            put_records(fake, _settings(), _records(1), sleep=lambda s: None)
        assert len(fake.calls) == 1


def test_settings_from_config_follow_the_dedup_key() -> None:
    """from_config targets the staging stream and puts the ID where copier.dedupKey says."""
    base = "applicationName=a\nstreamName=staging\nregionName=eu-west-1\ncopier.targetStreamName=t\n"
    nested = WriterSettings.from_config(parse_config(base + "copier.dedupKey=json:meta.id\n"), aggregate=True)
    assert (nested.stream_name, nested.region, nested.id_path, nested.aggregate) == (
        "staging",
        "eu-west-1",
        ("meta", "id"),
        True,
    )
    by_key = parse_config(base + "copier.dedupKey=partitionKey\n")
    assert WriterSettings.from_config(by_key).id_path == ("eventId",)
    with pytest.raises(ConfigError):
        WriterSettings.from_config(by_key, partition_key_column="user")


def test_flaky_kinesis_is_picklable() -> None:
    """The fault-injection client and its factory survive pickling, as Spark ships them."""
    import pickle

    factory = functools.partial(flaky_kinesis, key="p", fail_calls=1)
    assert isinstance(pickle.loads(pickle.dumps(factory))(_settings()), FlakyKinesis)
    assert pickle.loads(pickle.dumps(FlakyKinesis(_settings()))).fail_calls == 3


# --- real Spark jobs against the local backend ------------------------------------------------------


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """One local[2] Spark session for this module, bound to 127.0.0.1; its JVM is ended afterwards."""
    assert shutil.which("java"), "Spark needs java (make install installs pyspark; java comes with the machine)"
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    saved = {k: os.environ.get(k) for k in ("SPARK_LOCAL_IP", "PYSPARK_PYTHON")}
    os.environ.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("copier-spark-writer-test")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        gateway = SparkContext._gateway
        if gateway is not None:
            gateway.shutdown()
            proc = getattr(gateway, "proc", None)
            if proc is not None:  # spark-submit's JVM exits when its stdin closes
                proc.stdin.close()
                try:
                    proc.wait(timeout=30)
                except Exception:
                    proc.kill()
                    proc.wait()
            SparkContext._gateway = None
            SparkContext._jvm = None
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def staging(endpoint: str) -> tuple[Any, str]:
    """A fresh 2-shard staging stream on the local backend."""
    kinesis = client("kinesis", endpoint)
    name = f"spark-staging-{uuid.uuid4().hex[:8]}"
    create_stream(kinesis, name, 2)
    return kinesis, name


def _events(spark: Any, n: int, partitions: int = 4) -> Any:
    return spark.range(n, numPartitions=partitions).selectExpr(
        "concat('evt-', lpad(cast(id as string), 5, '0')) as id",
        "id as n",
        "cast(id as decimal(12, 2)) / 4 as amount",
        "date_add(date'2024-01-01', cast(id % 30 as int)) as day",
        "timestamp_millis(1700000000000 + id) as ts",
        "named_struct('a', id, 'b', array(id, id + 1)) as nested",
        "cast(concat('b', cast(id as string)) as binary) as raw",
        "map('k', id) as m",
    )


def _payloads(kinesis: Any, stream: str) -> list[dict[str, Any]]:
    return [json.loads(r["Data"]) for r in read_stream(kinesis, stream)]


@pytest.mark.timeout(180)
def test_every_row_lands_with_its_id_column(spark: Any, staging: tuple[Any, str], endpoint: str) -> None:
    """A 3,000-row DataFrame lands as exactly 3,000 records carrying exactly the expected event IDs."""
    kinesis, stream = staging
    write_dataframe(_events(spark, 3000), WriterSettings(stream, REGION, endpoint, id_column="id"))
    payloads = _payloads(kinesis, stream)
    assert len(payloads) == 3000
    assert {p["eventId"] for p in payloads} == {f"evt-{i:05d}" for i in range(3000)}
    sample = next(p for p in payloads if p["eventId"] == "evt-00007")
    assert sample["amount"] == "1.750000" and sample["day"] == "2024-01-08"
    assert base64.b64decode(sample["raw"]) == b"b7" and sample["nested"] == {"a": 7, "b": [7, 8]}


@pytest.mark.timeout(180)
def test_derived_ids_equal_event_id_of_and_are_stable(spark: Any, staging: tuple[Any, str], endpoint: str) -> None:
    """Derived IDs are event_id_of(row) for every row, and writing the DataFrame twice writes the same IDs."""
    kinesis, stream = staging
    df = _events(spark, 3000).drop("id")
    settings = WriterSettings(stream, REGION, endpoint)
    write_dataframe(df, settings)
    write_dataframe(df, settings)
    expected = {event_id_of(row.asDict(recursive=True)) for row in df.collect()}
    counts = Counter(p["eventId"] for p in _payloads(kinesis, stream))
    assert len(expected) == 3000
    assert set(counts) == expected and set(counts.values()) == {2}


@pytest.mark.timeout(180)
def test_failed_entries_are_retried_until_every_row_lands(
    spark: Any, staging: tuple[Any, str], endpoint: str, tmp_path: Path
) -> None:
    """With entries failing (throughput, internal failure) and a 503, only failures are resent and all rows land."""
    kinesis, stream = staging
    calls_log = tmp_path / "calls.jsonl"
    factory = functools.partial(
        flaky_kinesis, key=uuid.uuid4().hex, fail_calls=3, request_failures=1, log_path=str(calls_log)
    )
    settings = WriterSettings(stream, REGION, endpoint, id_column="id", client_factory=factory, max_backoff_ms=20)
    write_dataframe(_events(spark, 1000, partitions=2), settings)
    payloads = _payloads(kinesis, stream)
    assert len(payloads) == 1000 and {p["eventId"] for p in payloads} == {f"evt-{i:05d}" for i in range(1000)}
    calls = read_flaky_log(str(calls_log))
    injected: Counter[str] = Counter()
    for call in calls:
        injected.update(call["injected"])
    assert {"ProvisionedThroughputExceededException", "InternalFailure", "ServiceUnavailable"} <= set(injected)
    # Every entry sent once, plus once more for each injected failure: nothing else was resent.
    assert sum(call["entries"] for call in calls) == 1000 + sum(injected.values())
    assert len(calls) >= 2 + 4  # two partitions' requests, plus the failing calls of each worker process


@pytest.mark.timeout(180)
def test_exhausted_budget_fails_the_job(spark: Any, staging: tuple[Any, str], endpoint: str) -> None:
    """Entries that never land fail the task after max_attempts, and the Spark job with it."""
    _, stream = staging
    factory = functools.partial(flaky_kinesis, key=uuid.uuid4().hex, fail_calls=10**9, every=1)
    settings = WriterSettings(
        stream, REGION, endpoint, id_column="id", client_factory=factory, max_attempts=3, max_backoff_ms=5
    )
    with pytest.raises(Exception) as failure:
        write_dataframe(_events(spark, 50, partitions=1), settings)
    assert "PutBudgetExhausted" in str(failure.value)
    assert "50 of 50 records still failing after 3 attempts" in str(failure.value)


def _records_by_shard(kinesis: Any, stream: str) -> dict[tuple[int, int], list[dict[str, Any]]]:
    out: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        hash_range = (int(shard["HashKeyRange"]["StartingHashKey"]), int(shard["HashKeyRange"]["EndingHashKey"]))
        it = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON")
        page = kinesis.get_records(ShardIterator=it["ShardIterator"], Limit=10000)
        out[hash_range] = page["Records"]
    return out


@pytest.mark.timeout(180)
def test_aggregation_packs_rows_per_shard(spark: Any, endpoint: str) -> None:
    """With aggregation, fewer Kinesis records than rows land, and de-aggregated they hold every ID on its shard."""
    kinesis = client("kinesis", endpoint)
    stream = f"spark-agg-{uuid.uuid4().hex[:8]}"
    create_stream(kinesis, stream, 4)
    write_dataframe(_events(spark, 3000), WriterSettings(stream, REGION, endpoint, id_column="id", aggregate=True))
    ids: list[str] = []
    kinesis_records = 0
    for (start, end), records in _records_by_shard(kinesis, stream).items():
        kinesis_records += len(records)
        for record in records:
            if kpl.is_aggregated(record["Data"]):
                ehks = kpl.decode(record["Data"]).explicit_hash_keys
                assert all(start <= int(k) <= end for k in ehks)
            for key, data in kpl.deaggregate(record["Data"], record["PartitionKey"]):
                assert start <= kpl.hash_key(key) <= end  # the shard a plain write of this event goes to
                ids.append(json.loads(data)["eventId"])
    assert kinesis_records < 100
    assert sorted(ids) == [f"evt-{i:05d}" for i in range(3000)]


@pytest.mark.timeout(180)
def test_too_large_row_fails_the_job_naming_the_event(spark: Any, staging: tuple[Any, str], endpoint: str) -> None:
    """A row over the Kinesis record limit fails the job with its event ID, before its partition sends anything."""
    kinesis, stream = staging
    df = spark.range(10, numPartitions=1).selectExpr(
        "concat('evt-', cast(id as string)) as id",
        "case when id = 7 then repeat('x', 1100000) else 'small' end as body",
    )
    with pytest.raises(Exception) as failure:
        write_dataframe(df, WriterSettings(stream, REGION, endpoint, id_column="id"))
    assert "RecordTooLargeError" in str(failure.value) and "evt-7" in str(failure.value)
    assert read_stream(kinesis, stream) == []


@pytest.mark.timeout(240)
def test_foreach_batch_writes_every_row_of_a_streaming_query(
    spark: Any, staging: tuple[Any, str], endpoint: str, tmp_path: Path
) -> None:
    """A file-source streaming query with trigger availableNow lands every row through foreach_batch, and its
    tally (``copier produce``'s summary line) counts them: seen, produce printed nothing of its own."""
    kinesis, stream = staging
    source = tmp_path / "in"
    source.mkdir()
    tally = Tally()
    for f in range(3):
        lines = [json.dumps({"id": f"s-{f}-{i}", "n": i, "body": "x" * 20}) for i in range(100)]
        (source / f"part-{f}.json").write_text("\n".join(lines) + "\n")
    query = (
        spark.readStream.schema("id STRING, n LONG, body STRING")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.foreachBatch(foreach_batch(WriterSettings(stream, REGION, endpoint, id_column="id"), tally))
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        assert query.awaitTermination(180)
        assert query.exception() is None
    finally:
        query.stop()
    payloads = _payloads(kinesis, stream)
    assert len(payloads) == 300
    assert {p["eventId"] for p in payloads} == {f"s-{f}-{i}" for f in range(3) for i in range(100)}
    assert (tally.records, tally.batches) == (300, 3)
    assert produce.summary(tally, stream) == f"produce: 300 records written to {stream} in 3 micro-batches"
