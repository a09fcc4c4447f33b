"""CloudWatch metrics: EMF documents sent to the agent's socket, checked against the format, never on stdout."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from copier.adapters.metrics import EmfEmitter, ShardMetrics
from copier.core.errors import ConfigError
from copier.local.backend import DUMMY_ENV
from copier.local.multilang import event
from tests.conftest import Pipeline
from tests.support.fakes import SHARD, World, config, rec
from tests.support.serving import EmfAgent, serving

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((Path(__file__).parent / "support" / "emf_schema.json").read_text())


@pytest.fixture
def agent() -> Iterator[EmfAgent]:
    with serving(EmfAgent()) as server:
        yield server


def _check_format(doc: dict[str, Any]) -> None:
    """The schema, plus what a schema cannot say: every name a directive uses is a member of the document."""
    jsonschema.validate(doc, SCHEMA)
    for directive in doc["_aws"]["CloudWatchMetrics"]:
        for dimension_set in directive["Dimensions"]:
            for name in dimension_set:
                assert isinstance(doc.get(name), str), f"dimension {name} is not a string member"
        for metric in directive["Metrics"]:
            value = doc.get(metric["Name"])
            values = value if isinstance(value, list) else [value]
            assert 1 <= len(values) <= 100 and all(isinstance(v, int | float) for v in values), metric["Name"]


def _wait_for(agent: EmfAgent, count: int, key: str | None = None) -> list[dict[str, Any]]:
    """The documents the agent received, once ``count`` of them (holding ``key``, if given) are there: they
    arrive on the agent's thread, a shard's and a retry's documents in either order."""
    deadline = time.monotonic() + 20

    def received() -> list[dict[str, Any]]:
        docs = [json.loads(line) for line in list(agent.lines)]
        return [d for d in docs if key is None or key in d]

    while len(received()) < count:
        assert time.monotonic() < deadline, f"the agent received {len(received())} documents, not {count}"
        time.sleep(0.01)
    return received()


def test_a_shard_sends_its_metrics_as_emf_to_the_agent_and_nothing_to_stdout(
    agent: EmfAgent, capfd: pytest.CaptureFixture[str]
) -> None:
    """Counts per interval, put latency, lag, retries by error code; every document valid EMF."""
    port = agent.server_address[1]
    cfg = config(metrics="emf", metricsAgentEndpoint=f"tcp://127.0.0.1:{port}", metricsIntervalSeconds=60)
    world = World(cfg)
    world.metrics = EmfEmitter(cfg, worker="host-a")
    throttled = [True]

    def one_throttled(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        if throttled:  # the first request's last entry is throttled once
            throttled.clear()
            return [True] * (len(entries) - 1) + [False], None
        return [True] * len(entries), None

    world.streams.fault = one_throttled
    worker = world.worker()
    worker.process([rec(1, "a"), rec(2, "b"), rec(3, "c")], behind_ms=1500)
    worker.process([rec(4, "a"), rec(5, "d")], behind_ms=700)  # "a" again: a duplicate
    assert agent.lines == [], "nothing before the interval has passed"
    world.clock.advance(61_000)
    worker.process([rec(6, "e")], behind_ms=200)
    worker.process([rec(7, "f")], behind_ms=100)
    worker.release()  # a release sends what is left at once

    docs = _wait_for(agent, 3)
    for doc in docs:
        _check_format(doc)
    shard_docs = [d for d in docs if "EventsForwarded" in d]
    retry_docs = [d for d in docs if "PutRetries" in d]
    assert len(shard_docs) == 2, "one at the interval, one at the release"
    first, last = shard_docs
    assert first["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [
        ["Application"],
        ["Application", "ShardId"],
        ["Application", "WorkerId"],
    ]
    assert (first["Application"], first["ShardId"], first["WorkerId"]) == ("app", worker.shard_id, "host-a")
    assert (first["EventsForwarded"], first["DuplicatesDropped"], first["MillisBehindLatest"]) == (5, 1, 1500)
    assert (last["EventsForwarded"], last["DuplicatesDropped"], last["MillisBehindLatest"]) == (1, 0, 100)
    assert sum(d["EventsForwarded"] for d in shard_docs) == len(world.target_ids()) == 6
    assert first["DedupWindowIds"] == 5 and first["ShardStalled"] == 0 and first["PossibleDuplicates"] == 0
    latencies = first["PutLatency"] if isinstance(first["PutLatency"], list) else [first["PutLatency"]]
    assert len(latencies) == 4 and all(v >= 0 for v in latencies), "one value per put request (one retried)"
    units = {m["Name"]: m.get("Unit") for m in first["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert units["PutLatency"] == "Milliseconds" and units["EventsForwarded"] == "Count"
    assert [(d["ErrorCode"], d["PutRetries"]) for d in retry_docs] == [("ProvisionedThroughputExceededException", 1)]
    assert retry_docs[0]["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Application", "ErrorCode"]]
    out, _ = capfd.readouterr()
    assert "_aws" not in out, "no EMF on stdout: it is the MultiLang protocol channel"


def test_a_stalled_shard_reports_it_while_it_waits(agent: EmfAgent) -> None:
    """ShardStalled is 1 while AWS rejects the shard's requests (the alarm's signal), 0 once it moves."""
    from copier.core.errors import FatalAwsError

    port = agent.server_address[1]
    cfg = config(metrics="emf", metricsAgentEndpoint=f"tcp://127.0.0.1:{port}", metricsIntervalSeconds=1)
    world = World(cfg)
    world.metrics = EmfEmitter(cfg, worker="host-a")
    rejections = [2]

    def rejected(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        if rejections[0]:
            rejections[0] -= 1
            world.clock.advance(2000)
            return [False] * len(entries), FatalAwsError("PutRecords", "ValidationException", "rejected")
        return [True] * len(entries), None

    world.streams.fault = rejected
    worker = world.worker()
    worker.process([rec(1, "a")])
    world.clock.advance(2000)
    worker.process([rec(2, "b")])
    # each stall: the shard's document and one of its retries by error code; then the shard moves again
    docs = _wait_for(agent, 5)
    assert [d["ShardStalled"] for d in docs if "ShardStalled" in d] == [1, 1, 0]
    assert [d["ErrorCode"] for d in docs if "PutRetries" in d] == ["ValidationException"] * 2
    assert world.target_ids() == Counter({"a": 1, "b": 1})


def test_a_shard_stalled_by_this_hosts_clock_says_so_in_its_document(agent: EmfAgent) -> None:
    """AWS refusing a put for its signature's time: ShardStalled is 1 and the document's StallReason is "clock"
    (an alarm on ShardStalled can tell a host's clock from a record AWS rejects); 0 and no reason once it moves."""
    from copier.core.errors import FatalAwsError

    port = agent.server_address[1]
    cfg = config(metrics="emf", metricsAgentEndpoint=f"tcp://127.0.0.1:{port}", metricsIntervalSeconds=1)
    world = World(cfg)
    world.metrics = EmfEmitter(cfg, worker="host-a")
    refusals = [FatalAwsError("PutRecords", "InvalidSignatureException", "Signature expired: 20261126T101000Z ...")]

    def refused(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        world.clock.advance(2000)
        return ([False] * len(entries), refusals.pop()) if refusals else ([True] * len(entries), None)

    world.streams.fault = refused
    worker = world.worker()
    worker.process([rec(1, "a")])
    world.clock.advance(2000)
    worker.process([rec(2, "b")])
    docs = _wait_for(agent, 2, key="ShardStalled")
    said = [(d["ShardStalled"], d.get("StallReason")) for d in docs]
    assert said[0] == (1, "clock") and set(said[1:]) == {(0, None)}, said
    _check_format(docs[0])


def test_the_clock_bound_is_a_gauge_in_milliseconds_when_the_caller_has_one(agent: EmfAgent) -> None:
    """ClockBoundMs is in the shard's document, valid EMF, only when a bound is passed to take()."""
    port = agent.server_address[1]
    cfg = config(metrics="emf", metricsAgentEndpoint=f"tcp://127.0.0.1:{port}")
    metrics = ShardMetrics()
    assert "ClockBoundMs" not in metrics.take({}, 0, 0.0, now_ms=1_000), "no bound measured yet: no value"
    values = metrics.take({"forwarded": 3}, 3, 1.5, now_ms=2_000, clock_bound_ms=37)
    assert values["ClockBoundMs"] == (37.0, "Milliseconds")
    EmfEmitter(cfg, worker="host-a").emit("shardId-000000000000", values, {})
    (doc,) = _wait_for(agent, 1)
    _check_format(doc)
    units = {m["Name"]: m.get("Unit") for m in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert (doc["ClockBoundMs"], units["ClockBoundMs"]) == (37, "Milliseconds")


def test_no_agent_costs_a_warning_not_an_event(unused_port: int) -> None:
    """Metrics are best effort: with nothing listening, every event is still forwarded."""
    cfg = config(metrics="emf", metricsAgentEndpoint=f"tcp://127.0.0.1:{unused_port}", metricsIntervalSeconds=1)
    world = World(cfg)
    world.metrics = EmfEmitter(cfg)
    worker = world.worker()
    for i in range(1, 4):
        worker.process([rec(i, f"e{i}")])
        world.clock.advance(1500)
    assert world.target_ids() == Counter({"e1": 1, "e2": 1, "e3": 1})


@pytest.fixture
def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("metrics", "cloudwatch", "expected one of none, emf"),
        ("metricsAgentEndpoint", "127.0.0.1:25888", "expected tcp://HOST:PORT"),
        ("metricsIntervalSeconds", "0", "from 1 to 3600"),
        ("metricsNamespace", "bad namespace", "not a valid CloudWatch namespace"),
    ],
)
def test_bad_metrics_settings_are_refused(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config(**{key: value})


def _shard_documents(agent: EmfAgent, forwarded: int) -> list[dict[str, Any]]:
    """The shard documents the agent received, once they count ``forwarded`` events (the agent's thread)."""
    deadline = time.monotonic() + 20
    while True:
        docs = [json.loads(line) for line in list(agent.lines)]
        shard_docs = [d for d in docs if "EventsForwarded" in d]
        if sum(d["EventsForwarded"] for d in shard_docs) >= forwarded:
            return shard_docs
        assert time.monotonic() < deadline, f"the agent's documents count fewer than {forwarded} events"
        time.sleep(0.01)


def test_copier_process_reports_the_record_age_at_the_target_and_copier_status_the_checkpoint(
    agent: EmfAgent, pipeline: Pipeline, processors: Any
) -> None:
    """End to end: events that arrived in staging 4 s ago, forwarded by a real ``copier process`` to the local
    backend, are in its EMF document with their age at the target (RecordAgeP50, RecordAgeP99, RecordAgeMax, in
    ms): at least the 4 s they waited, at most that and the test's own time since, give or take what the host's
    clock measurement allows (the local backend's Date headers, a second's resolution). ``copier status --json``
    then shows the replication checkpoint the commit wrote through the lean store, read back through PynamoDB."""
    port = agent.server_address[1]
    pipeline.write_properties(metrics="emf", metricsAgentEndpoint=f"tcp://127.0.0.1:{port}", metricsIntervalSeconds=1)
    proc = processors(pipeline)
    proc.initialize(SHARD)
    sent = time.time_ns() // 1_000_000
    proc.process([replace(event(i, f"e{i}"), arrival_ms=sent - 4_000 + i) for i in range(1, 21)])
    proc.shutdown_requested()  # the release sends what is left at once
    elapsed = time.time_ns() // 1_000_000 - sent
    docs = _shard_documents(agent, forwarded=20)
    aged = [d for d in docs if "RecordAgeMax" in d]
    assert aged, "a document carries the record age"
    for doc in aged:
        _check_format(doc)
        units = {m["Name"]: m.get("Unit") for m in doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
        assert {units[n] for n in ("RecordAgeP50", "RecordAgeP99", "RecordAgeMax")} == {"Milliseconds"}
        assert doc["RecordAgeP50"] <= doc["RecordAgeP99"] <= doc["RecordAgeMax"]
    oldest = max(d["RecordAgeMax"] for d in aged)
    assert 4_000 - 19 - 1_000 <= oldest <= 4_000 + elapsed + 1_000, (oldest, elapsed)
    assert proc.close() == 0
    status = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "copier"), "status", "--properties", str(pipeline.properties), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **DUMMY_ENV},
        timeout=60,
        check=True,
    )
    (row,) = [json.loads(line) for line in status.stdout.splitlines()]
    assert (row["position"], row["position_arrival_ms"]) == ("20/0", sent - 4_000 + 20)
    assert 4_000 - 20 - 1_000 <= row["position_age_ms"] <= 4_000 + elapsed + 1_000


def test_a_new_owners_first_document_counts_only_what_it_forwarded(agent: EmfAgent) -> None:
    """The state item's counters are the shard's totals over every owner; a processor that takes the shard over
    reports what it adds to them, so that a dashboard's sum over time is the events forwarded, not the shard's
    history again at each takeover."""
    port = agent.server_address[1]
    cfg = config(metrics="emf", metricsAgentEndpoint=f"tcp://127.0.0.1:{port}", metricsIntervalSeconds=60)
    world = World(cfg)
    world.metrics = EmfEmitter(cfg, worker="host-a")
    first = world.worker()
    first.process([rec(1, "a"), rec(2, "b"), rec(3, "c")])
    first.release()
    second = world.worker()
    second.process([rec(4, "d")])
    second.release()
    docs = _wait_for(agent, 2, key="EventsForwarded")
    assert [d["EventsForwarded"] for d in docs] == [3, 1]
    assert sum(d["EventsForwarded"] for d in docs) == len(world.target_ids()) == 4
