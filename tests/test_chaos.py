"""The fault-injection suite: its plans are reproducible, and a short fixed set of seeds passes (make chaos runs 50+).

Each smoke seed is the real pipeline under faults: ``copier.chaos.run``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from copier.chaos import __main__ as chaos_main
from copier.chaos.digest import code_digest
from copier.chaos.producer import alt_id, event_id, read_event_id
from copier.chaos.proxy import FAULT_KINDS
from copier.chaos.report import render
from copier.chaos.run import SeedResult, run_seed
from copier.chaos.schedule import (
    AUTO_SWITCHES,
    BASE_SETTINGS,
    DEDUP_KEYS,
    FULL,
    LIMITS,
    PROCESS_FAULTS,
    SMOKE,
    TARGET_RESHARDS,
    UNKEYED_POLICIES,
    Plan,
    draw,
    on_backend,
)
from tests.conftest import backend_for

# KCL 3.x and 2.x; kills, pauses past the lease, a split and a merge, proxy faults; hosts off time beyond the
# margin and clock steps both ways, settings changing between owners, a target split at an ambiguous put.
SMOKE_SEEDS = [8, 10]


def test_a_seed_always_draws_the_same_plan() -> None:
    """A plan depends on its seed alone: the same seed, the same plan; another seed, another plan."""
    assert draw(7) == draw(7) and draw(7) != draw(8)
    assert draw(7, SMOKE) == draw(7, SMOKE)


def test_fifty_seeds_draw_every_kind_of_fault_in_both_kcl_modes() -> None:
    """Across the 50 seeds of make chaos: every process fault, both reshards, every proxy fault, every poison,
    pauses shorter and longer than the lease, and both KCL modes."""
    plans = [draw(seed, FULL) for seed in range(1, 51)]
    actions = {a.kind for p in plans for a in p.actions}
    assert set(PROCESS_FAULTS) | {"split", "merge"} <= actions
    assert set(FAULT_KINDS) <= {w.kind for p in plans for w in p.windows}
    assert {"no_id", "not_json", "oversize"} <= {k for p in plans for k in p.poison}
    pauses = {a.params["past_lease"] for p in plans for a in p.actions if a.kind.startswith("pause")}
    assert pauses == {True, False}
    assert {p.kcl_mode for p in plans} == {"3.x", "2.x"}
    assert all(2 <= p.workers <= 4 for p in plans)


def _later_kinds(plan: Plan) -> set[str]:
    """The clock, settings and target-reshard faults a plan draws, by name."""
    kinds = {f"clock_{c.kind}" for c in plan.clocks}
    kinds |= {s.dedup_key for s in plan.settings} | {s.unkeyed_policy for s in plan.settings}
    for a in plan.actions:
        if a.kind == "clock_step":
            kinds.add("step_forward" if a.params["step_ms"] > 0 else "step_back")
        elif a.kind in TARGET_RESHARDS:
            kinds.add(f"{a.kind}_ambiguous" if a.params["ambiguous_put"] else a.kind)
        elif a.kind in AUTO_SWITCHES:
            kinds.add(a.kind)
    return kinds


def test_fifty_seeds_draw_clocks_settings_and_target_reshards_of_every_kind() -> None:
    """Across the 50 seeds: hosts on time, within and beyond the margin, steps both ways, several skews, both
    dedup keys and unkeyed policies, target splits and merges at an ambiguous put and not; and seeds without."""
    plans = [draw(seed, FULL) for seed in range(1, 51)]
    kinds = set().union(*(_later_kinds(p) for p in plans))
    assert {"clock_none", "clock_within", "clock_beyond", "step_forward", "step_back"} <= kinds
    assert set(DEDUP_KEYS) | set(UNKEYED_POLICIES) <= kinds
    assert {f"{k}{a}" for k in TARGET_RESHARDS for a in ("", "_ambiguous")} <= kinds
    assert set(AUTO_SWITCHES) <= kinds and any(not set(AUTO_SWITCHES) & _later_kinds(p) for p in plans)
    for a in (a for p in plans for a in p.actions if a.kind in AUTO_SWITCHES):
        if a.kind == "staging_auto":  # around the late duplicates, the only plain records certain to come
            assert FULL.late_at_s - 2.0 <= a.at_s <= FULL.late_at_s and a.params["seconds"] >= 4.0, a
        else:  # while the copier puts the bulk of the events
            assert a.at_s <= 0.2 * FULL.produce_s, a
    assert {p.clock_skew_ms for p in plans if p.clocks} == set(FULL.clock_skews_ms)
    assert any(not p.clocks for p in plans) and any(p.settings == (BASE_SETTINGS,) for p in plans)
    for p in plans:
        skew = p.clock_skew_ms
        assert all(abs(c.offset_ms) <= skew // 2 for c in p.clocks if c.kind == "within")
        assert all(abs(c.offset_ms) >= 3 * skew for c in p.clocks if c.kind == "beyond")
        assert not p.clocks or len(p.clocks) == p.workers + sum(1 for a in p.actions if a.kind == "worker_join")


def test_each_smoke_seed_has_each_later_kind_of_fault() -> None:
    """make test's seeds: a host beyond the margin, a step each way, both settings changed between the first two
    starts, and a target reshard at an ambiguous put (the smoke profile forces them)."""
    for seed in SMOKE_SEEDS:
        plan = draw(seed, SMOKE)
        kinds = _later_kinds(plan)
        assert {"clock_beyond", "step_forward", "step_back", "json:meta.alt", "forward"} <= kinds, (seed, kinds)
        assert plan.settings[0] != plan.settings[1] and plan.settings[0] == BASE_SETTINGS
        assert any(k.endswith("_ambiguous") for k in kinds), (seed, kinds)
        assert set(AUTO_SWITCHES) <= kinds, (seed, kinds)


def test_a_limits_seed_writes_staging_at_its_shards_limit_through_the_shard_limits_alone() -> None:
    """The limits profile: the proxy enforces the shard limits, opens no fault window of its own, and the
    producer offers its staging shard about its 1 MiB a second or more."""
    for seed in range(1, 11):
        plan = draw(seed, LIMITS)
        assert plan.shard_limits and plan.windows == () and plan.profile == "limits"
        offered = plan.events * plan.event_bytes / plan.produce_s / plan.staging_shards
        assert offered >= 0.75 * 1024 * 1024, (seed, offered)
        assert plan.staging_shards == plan.target_shards == 1
    assert not draw(1, FULL).shard_limits and not draw(1, SMOKE).shard_limits


def test_the_later_faults_leave_a_seeds_earlier_faults_as_they_were() -> None:
    """Clocks, settings, target reshards and AUTO switches come from generators of their own: without them,
    the same plan."""
    without = replace(FULL, clock_share=0.0, settings_share=0.0, target_reshards=(0, 0), auto_share=0.0)
    for seed in range(1, 21):
        full, bare = draw(seed, FULL), draw(seed, without)
        later = {"clock_step", *TARGET_RESHARDS, *AUTO_SWITCHES}
        assert [a for a in full.actions if a.kind not in later] == list(bare.actions)
        assert full.windows == bare.windows
        assert (bare.clocks, bare.settings) == ((), (BASE_SETTINGS,))


def test_a_seed_on_the_independent_backend_leaves_out_only_what_kinesis_mock_cannot_serve() -> None:
    """No oversize poison (no UpdateMaxRecordSize) and no AUTO switch (no RecordDistributionStrategy) on
    kinesis-mock; everything else is the seed's plan as drawn, and on moto the whole plan."""
    plan = draw(8, SMOKE)
    there = on_backend(plan, "independent")
    assert "oversize" in plan.poison and {"staging_auto", "target_auto"} <= {a.kind for a in plan.actions}
    assert [p for p in plan.poison if p != "oversize"] == list(there.poison)
    assert [a for a in plan.actions if a.kind not in AUTO_SWITCHES] == list(there.actions)
    assert replace(there, poison=plan.poison, actions=plan.actions) == plan
    assert on_backend(plan, "moto") == plan


def test_the_report_has_a_summary_and_a_row_a_seed() -> None:
    """Totals add the seeds up; a failed seed shows its failures."""
    good = SeedResult(1, "full", "3.x", 2, ok=True, events=10, faults={"kill_host": 1, "proxy_put_timeout": 2})
    bad = SeedResult(2, "full", "2.x", 3, ok=False, events=5, lost=1, failures=["lost 1: e-1"], faults={"kill_host": 1})
    bad.backend = "independent"
    text = render([good, bad], "python -m copier.chaos --seeds 2", 120.0)
    assert "Backend: independent 1 seeds, moto 1 seeds." in text and "BACKEND=independent" in text
    assert "| 2 | 1 | 15 |" in text and "| kill_host | 2 |" in text
    assert "FAILED: lost 1: e-1" in text and "`python -m copier.chaos --seeds 2`" in text
    assert "In progress" not in text, "a complete run says nothing of progress"
    assert "## What a seed must show to pass" in text and "one copy per" in text
    partial = render([good, bad], "python -m copier.chaos --seeds 5", 120.0, planned=5)
    assert "In progress or interrupted: 2 of 5 seeds ran." in partial


def test_the_report_describes_and_sums_the_clock_settings_and_target_reshard_faults() -> None:
    """The method section names the four later kinds; the summary adds up what each seed recorded of them."""
    clocks = [
        {"kind": "beyond", "margin_widened": 2},
        {"kind": "beyond", "margin_widened": 0},
        {"kind": "within", "margin_widened": 1},
    ]
    settings = [{"settings": {"dedup_key": k, "unkeyed_policy": "forward"}} for k in ("json:eventId", "json:meta.alt")]
    faults = {"clock_offset_beyond": 2, "clock_step_back": 1, "target_split": 1}
    faults |= {"target_reshard_across_ambiguous_put": 1, "staging_auto": 1, "target_auto": 1}
    one = SeedResult(1, "full", "3.x", 2, ok=True, clocks=clocks, settings=settings, faults=faults, unkeyed_copies=3)
    one.scattered_staging, one.scattered_target, one.unordered = 40, 12, 30
    text = render([one, SeedResult(2, "full", "2.x", 2, ok=True)], "python -m copier.chaos --seeds 2", 60.0)
    assert "**Clocks off AWS time.**" in text and "**Target reshards.**" in text and "libfaketime" in text
    assert "- Clocks: 1 seeds with hosts under libfaketime" in text
    assert "beyond it 2; clock steps 0 forward, 1 back; `clock_margin_widened` logged on 1 of the 2 hosts" in text
    assert "- Settings: 1 seeds whose workers ran different settings" in text
    assert "- Target reshards: 1, 1 of them across an ambiguous target put" in text
    assert "under `unkeyedPolicy = forward`: 3 further copies" in text
    assert "**Streams that ignore partition keys.**" in text
    assert "AUTO): staging 1 times, target 1; 40 staging and 12 target records off their key's shard; 30" in text


def test_resume_keeps_the_seeds_that_ran_on_the_same_code_and_only_those(tmp_path: Path) -> None:
    """An interrupted run goes on with the seeds it has not run; results of other code, profile or backend start
    over. Results written before seeds named their backend (no ``backend`` field) are moto's."""
    raw = tmp_path / "reliability.json"
    report = tmp_path / "reliability.md"
    done = [SeedResult(s, "full", "3.x", 2, ok=True, events=100 * s).to_json() for s in (1, 2)]
    for result in done:
        del result["backend"]
    code = code_digest()
    raw.write_text(json.dumps({"code": code, "elapsed_s": 600.0, "planned_seeds": 2, "results": done}))
    argv = ["--seeds", "2", "--json", str(raw), "--report", str(report), "--workdir", str(tmp_path), "--resume"]
    # A child process: main() configures logging for the whole process.
    run = subprocess.run([sys.executable, "-m", "copier.chaos", *argv], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "resuming: 2 seeds already ran on this code ([1, 2])" in run.stdout, "both seeds kept, none run again"
    again = json.loads(raw.read_text())
    assert [r["seed"] for r in again["results"]] == [1, 2] and again["code"] == code
    assert "seed-1" not in {p.name for p in tmp_path.iterdir()}, "no seed ran"
    assert "Code digest `" + code + "`" in report.read_text()

    class Args:
        json_path = str(raw)
        profile = "smoke"
        backend = "moto"

    assert chaos_main._resumed(Args(), code) == ([], 0.0), "another profile starts over"  # type: ignore[arg-type]
    Args.profile = "full"
    assert chaos_main._resumed(Args(), "0" * 16) == ([], 0.0), "other code starts over"  # type: ignore[arg-type]
    Args.backend = "independent"
    assert chaos_main._resumed(Args(), code) == ([], 0.0), "another backend starts over"  # type: ignore[arg-type]
    Args.backend = "moto"
    kept, elapsed = chaos_main._resumed(Args(), code)  # type: ignore[arg-type]
    assert [r.seed for r in kept] == [1, 2] and elapsed >= 600.0
    assert {r.backend for r in kept} == {"moto"}


@pytest.mark.protocol
@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", SMOKE_SEEDS)
def test_a_chaos_seed_loses_and_duplicates_nothing(endpoint: str, tmp_path: Path, seed: int) -> None:
    """The real pipeline under the seed's faults: nothing lost, every duplicate reported, poison delivered, no
    crash loop, every shard caught up; and the faults were really injected, the clocks measured by the copier."""
    result = run_seed(draw(seed, SMOKE), endpoint, tmp_path)
    faults = _passed_under_faults(result, tmp_path)
    assert result.backend == "moto"
    assert result.faults.get("poison_oversize", 0) >= 1, "a record too large for the target went through"
    assert faults.get("staging_auto", 0) == faults.get("target_auto", 0) == 1, faults
    assert len(result.auto_switches) == 2 and result.scattered_staging > 0, (result.auto_switches, result)


@pytest.mark.protocol
@pytest.mark.timeout(600)
def test_a_chaos_seed_on_the_independent_backend_loses_and_duplicates_nothing(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The first smoke seed on kinesis-mock and dynalite, which copier did not write or patch: the same verdict,
    with its faults, without what kinesis-mock cannot serve (oversize records, AUTO switches); the closed target
    shard (EndingSequenceNumber 2^63-1 there) read to its end, the state table's calls through the proxy."""
    backend = backend_for(request, "independent")
    result = run_seed(draw(SMOKE_SEEDS[0], SMOKE), backend, tmp_path)
    faults = _passed_under_faults(result, tmp_path)
    assert result.backend == "independent" and result.proxy_requests.get("state", 0) > 0, result.proxy_requests
    assert not {"poison_oversize", "staging_auto", "target_auto"} & set(faults), faults


def _passed_under_faults(result: SeedResult, logs: Path) -> dict[str, int]:
    """What every smoke seed must show, on either backend: it passed, nothing lost or duplicated unreported,
    several pages a shard, proxy, process, clock, settings and target-reshard faults injected; its faults."""
    assert result.ok, f"{result.failures}; logs in {logs}"
    assert (result.lost, result.duplicated - result.explained_duplicates) == (0, 0)
    assert result.target_records + result.dead_letter_records >= result.events + result.poison
    assert result.check_pages > result.target_shards, "the check read shards of several pages"
    injected = {k: v for k, v in result.faults.items() if k.startswith("proxy_")}
    assert sum(injected.values()) > 0, result.proxy_requests
    assert any(k.split("_past")[0] in PROCESS_FAULTS for k in result.faults), result.faults
    faults = result.faults
    assert faults.get("clock_offset_beyond", 0) >= 1 and faults.get("settings_change", 0) >= 1, faults
    assert faults.get("clock_step_forward", 0) + faults.get("clock_step_back", 0) >= 1, faults
    assert faults.get("target_split", 0) + faults.get("target_merge", 0) >= 1 and result.target_shards_closed >= 1
    beyond = [c for c in result.clocks if c["kind"] == "beyond" and c["max_bound_ms"] is not None]
    assert any(
        c["margin_widened"] and any(abs(m - o) <= 500 for m in c["measured_offsets_ms"] for o in _offsets_held(c))
        for c in beyond
    ), f"a host beyond the margin was measured and its margins widened: {result.clocks}"
    return faults


def _offsets_held(clock: dict) -> list[int]:
    """Every offset a host's clock held during the seed: its first, then one after each step (a measurement
    taken after a step sees the stepped clock)."""
    return [clock["offset_ms"], *(step["offset_ms"] for step in clock["steps"])]


def test_the_producer_draws_ids_at_the_edges_of_identity_and_reads_them_back_by_itself() -> None:
    """Integers and strings of the same digits (two events), unicode, IDs over 256 characters; meta.alt one to
    one with eventId; the check's own reader keeps 7 and "7" apart and takes no bool for an ID."""
    ids = [event_id(n, "c1") for n in range(1, 23)]
    assert any(isinstance(i, int) for i in ids) and str(ids[0]) in ids, ids[:3]
    assert any(isinstance(i, str) and not i.isascii() for i in ids)
    assert any(isinstance(i, str) and len(i) > 256 for i in ids)
    assert len(set(ids)) == len(ids) and len({alt_id(i) for i in ids}) == len(ids)
    assert alt_id(7) != alt_id("7")
    assert [read_event_id(d) for d in (b'{"eventId": 7}', b'{"eventId": "7"}', b'{"eventId": true}', b"[7]")] == [
        7,
        "7",
        None,
        None,
    ]


class _ThrottlesFirstEntryOnce:
    """A staging client whose first PutRecords fails its first entry, as a shard over its write limit does."""

    def __init__(self) -> None:
        self.sequence = 0

    def put_records(self, StreamName: str, Records: list[dict[str, object]]) -> dict[str, object]:  # noqa: N803
        results: list[dict[str, object]] = []
        for n, _ in enumerate(Records):
            if self.sequence == 0 and n == 0:
                results.append({"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "Rate exceeded"})
                continue
            self.sequence += 1
            results.append({"ShardId": "shardId-000000000000", "SequenceNumber": str(self.sequence)})
        return {"FailedRecordCount": sum(1 for r in results if "ErrorCode" in r), "Records": results}


def test_the_producer_records_a_retried_entry_after_the_entries_that_landed_before_it() -> None:
    """Order is judged as records are in staging: an entry throttled and written again lands after the others."""
    from copier.chaos.producer import ChaosProducer
    from copier.core import kpl

    producer = ChaosProducer(_ThrottlesFirstEntryOnce(), "s", draw(1, LIMITS), "r")
    records = [kpl.KinesisRecord("k", None, json.dumps({"eventId": e}).encode()) for e in ("first", "second")]
    placed = producer._put(records, [1, 1])
    assert [p.event_id for p in producer.out.records] == ["second", "first"]
    assert placed == [("shardId-000000000000", "2"), ("shardId-000000000000", "1")]  # in the request's order
