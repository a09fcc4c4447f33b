"""The real KCL MultiLangDaemon end to end on the embedded local backend.

Two ``copier run`` workers copy a staging stream with producer duplicates
in it; one is SIGKILLed mid-run (the JVM only, so its processors live on as
zombies that must be fenced) and a third is started; the staging stream is
split while running. ``copier verify`` must then find nothing lost and
nothing duplicated. The same, smaller, on the independent backend (kinesis-mock and dynalite), and
there under enhanced fan-out (``retrievalMode = FANOUT``) with a worker killed but no split.
"""

from __future__ import annotations

import contextlib
import functools
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from copier.local.backend import LocalBackend
from copier.local.independent import ENV_MARK, Endpoints, create_lease_table
from copier.local.pipeline import LocalPipeline
from copier.local.producer import produce

CLEAN = "lost: 0, pending: 0 (in staging after the copier's committed position), duplicated: 0"

pytestmark = [pytest.mark.protocol, pytest.mark.timeout(420)]

SERVICE = Path(__file__).resolve().parent.parent / "scripts" / "copier.service"


def stop_timeout_s() -> float:
    """``TimeoutStopSec`` of the shipped systemd unit: how long a graceful stop may take on a host.

    A host's first stop also has its JVM write the class-data archive at exit
    (``copier/kcl/classarchive.py``): on 2 busy cores that took 9 s after the
    5 s shutdown grace, past a fixed 15 s (a flaky failure, -9 for a worker
    that was stopping cleanly).
    """
    match = re.search(r"^TimeoutStopSec=(\d+)s?$", SERVICE.read_text(), re.MULTILINE)
    assert match, f"{SERVICE} sets TimeoutStopSec"
    return float(match.group(1))


def test_two_workers_a_sigkill_and_a_split_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    """Exactly once through worker loss, lease moves and resharding, checked by copier verify."""
    with LocalBackend() as backend:
        pipeline = LocalPipeline(
            backend.endpoint, tmp_path, staging="staging-e2e", target="target-e2e", application="copier-e2e"
        )
        try:
            pipeline.create(staging_shards=2, target_shards=2)
            produced = produce(pipeline.kinesis, pipeline.staging, 3000, run="e2e", seed=3)
            pipeline.start_worker("a")
            pipeline.start_worker("b")

            def forwarded() -> int:
                return pipeline.counters().get("forwarded", 0)

            assert pipeline.wait(lambda: forwarded() >= 1000, 180), f"no progress; see the logs in {tmp_path}"
            victim = pipeline.busiest_worker()
            victim.kill_daemon()
            pipeline.start_worker("c")
            first = sorted(pipeline.shard_states())[0]
            children = pipeline.split(first)
            assert len(children) == 2
            produce(pipeline.kinesis, pipeline.staging, 3000, run="e2e", seed=4, start=3000, out=produced)
            assert set(children) <= set(produced.last), "new writes land in the children"
            caught_up = pipeline.wait(lambda: pipeline.caught_up(produced.last), 240)
            states = pipeline.shard_states()
            assert caught_up, {k: (str(s.position), s.owner) for k, s in states.items()}

            verify = pipeline.verify(produced.manifest)
            assert verify.returncode == 0, verify.stdout + verify.stderr
            assert CLEAN in verify.stdout
            for child in children:
                assert states[child].counters.get("forwarded", 0) > 0, f"{child} was copied"
            assert any(s.epoch >= 2 for s in states.values()), "a shard changed hands after the SIGKILL"
            assert sum(s.counters.get("duplicates", 0) for s in states.values()) > 0, "producer duplicates dropped"

            # SIGTERM: every processor running then gets shutdown_requested, checkpoints and releases
            owners = [w for w in pipeline.workers if pipeline.shards_owned().get(w.name)]
            survivors = [w for w in pipeline.workers if w is not victim]
            for worker in survivors:
                worker.terminate()
            for worker in survivors:  # the budget a host's systemd gives a stop before its SIGKILL
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.proc.wait(timeout=stop_timeout_s())
            assert owners and pipeline.stop_workers(survivors) == [0] * len(survivors), "stopped by SIGTERM"
            for worker in owners:
                assert '"event": "released"' in worker.log_path.read_text(), f"{worker.name} released its shards"
        finally:
            pipeline.stop_all()


def on_independent(
    tmp_path: Path, independent: Endpoints, monkeypatch: pytest.MonkeyPatch, name: str, **kcl: str
) -> LocalPipeline:
    """A pipeline on kinesis-mock and dynalite with the local-only steps: the KCL's lease table made with its
    index first (dynalite cannot add it) and COPIER_LOCAL_BACKEND=independent (dynalite has no TTL)."""
    monkeypatch.setenv(ENV_MARK, "independent")
    application = f"copier-e2e-{name}"
    create_lease_table(independent.dynamodb, application)
    return LocalPipeline(
        independent.kinesis,
        tmp_path,
        staging=f"staging-e2e-{name}",
        target=f"target-e2e-{name}",
        application=application,
        dynamodb_endpoint=independent.dynamodb,
        kcl=dict(kcl),
    )


def exactly_once_after_a_takeover(pipeline: LocalPipeline, produced: Any) -> dict[str, Any]:
    """Waits for the target to catch up, then: copier verify clean and a shard changed hands; the shard states."""
    caught_up = pipeline.wait(lambda: pipeline.caught_up(produced.last), 240)
    states = pipeline.shard_states()
    assert caught_up, {k: (str(s.position), s.owner) for k, s in states.items()}
    verify = pipeline.verify(produced.manifest)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert CLEAN in verify.stdout
    assert any(s.epoch >= 2 for s in states.values()), "a shard changed hands after the SIGKILL"
    return states


def test_on_kinesis_mock_and_dynalite_a_killed_worker_and_a_split_lose_and_duplicate_nothing(
    tmp_path: Path, independent: Endpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same proof, smaller (kinesis-mock is slow on puts), on the independent backend: the real daemon
    with the lean client against kinesis-mock and dynalite, one worker's JVM SIGKILLed, a staging shard split,
    and copier verify finds the target exactly once. The local-only steps: the KCL's lease table made with its
    index first (dynalite cannot add it), and COPIER_LOCAL_BACKEND=independent (dynalite has no TTL)."""
    pipeline = on_independent(tmp_path, independent, monkeypatch, "independent")
    try:
        pipeline.create(staging_shards=2, target_shards=2)
        produced = produce(pipeline.kinesis, pipeline.staging, 600, run="e2e", seed=5)
        pipeline.start_worker("a")
        pipeline.start_worker("b")
        assert pipeline.wait(lambda: pipeline.counters().get("forwarded", 0) >= 200, 180), f"see {tmp_path}"
        pipeline.busiest_worker().kill_daemon()
        first = sorted(pipeline.shard_states())[0]
        children = pipeline.split(first)
        assert len(children) == 2
        produce(pipeline.kinesis, pipeline.staging, 600, run="e2e", seed=6, start=600, out=produced)
        states = exactly_once_after_a_takeover(pipeline, produced)
        for child in children:
            assert states[child].counters.get("forwarded", 0) > 0, f"{child} was copied"
    finally:
        pipeline.stop_all()


def test_under_fanout_on_kinesis_mock_a_killed_worker_and_its_replacement_lose_and_duplicate_nothing(
    tmp_path: Path, independent: Endpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``retrievalMode = FANOUT`` end to end: the real daemon reads staging over SubscribeToShard from
    kinesis-mock (moto has none), one worker's JVM is SIGKILLed mid-way and a replacement started, and copier
    verify finds every event once in the target. The consumer the daemon registered (named after the
    application, copier.core.retrieval) shows it read by fan-out: a polling daemon registers none. No split:
    kinesis-mock 0.6.2 never ends a closed shard's subscription (docs/operations.md, "Polling or enhanced
    fan-out")."""
    pipeline = on_independent(tmp_path, independent, monkeypatch, "fanout", retrievalMode="FANOUT")
    application = pipeline.application
    try:
        assert pipeline.config.retrieval_mode == "FANOUT"
        pipeline.create(staging_shards=2, target_shards=2)
        # batches of 100, half of them with a slice written twice: producer duplicates for the copier to drop
        write = functools.partial(produce, pipeline.kinesis, pipeline.staging, run="fanout", batch=100, retry_rate=0.5)
        produced = write(500, seed=8)
        pipeline.start_worker("a")
        pipeline.start_worker("b")
        assert pipeline.wait(lambda: pipeline.counters().get("forwarded", 0) >= 150, 180), f"see {tmp_path}"
        victim = pipeline.busiest_worker()
        victim.kill_daemon()
        pipeline.start_worker("c")
        write(400, seed=9, start=500, out=produced)
        assert produced.duplicates > 0, "the producer wrote duplicates"
        states = exactly_once_after_a_takeover(pipeline, produced)
        assert sum(s.counters.get("duplicates", 0) for s in states.values()) > 0, "producer duplicates dropped"

        arn = pipeline.kinesis.describe_stream_summary(StreamName=pipeline.staging)["StreamDescriptionSummary"]
        consumers = pipeline.kinesis.list_stream_consumers(StreamARN=arn["StreamARN"])["Consumers"]
        assert [(c["ConsumerName"], c["ConsumerStatus"]) for c in consumers] == [(application, "ACTIVE")]
    finally:
        pipeline.stop_all()
