"""copier plan (copier.core.capacity): figures from docs/benchmarks.json, rates from the code, docs/capacity.md."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from copier.commands import plan as command
from copier.commands.cli import main
from copier.core import capacitylines
from copier.core.capacity import Plan, Workload, default_shards, per_chunk, plan
from copier.core.shardmap import LIST_SHARDS_PAGE, SHARD_MAP_MAX_AGE_S
from copier.core.summaryboard import mean_refresh_s

ROOT = Path(__file__).resolve().parent.parent
DAY = 86_400


def _plan(benchmarks: Path = command.BENCHMARKS, **workload: Any) -> Plan:
    measured, prices, settings = command.load(benchmarks, command.PRICES, command.PROPERTIES)
    values: dict[str, Any] = {"events_per_s": 1e10 / DAY, "record_bytes": 200, "instance": "m7a.4xlarge"}
    return plan(Workload(**{**values, **workload}), settings, measured, prices)


def _edited(tmp_path: Path, edit: Any) -> Path:
    raw = json.loads(command.BENCHMARKS.read_text(encoding="utf-8"))
    edit(raw)
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return path


def _line(p: Plan, name: str) -> float:
    return next(line.quantity for line in p.lines if line.name == name)


def _budget(p: Plan, api: str, scope: str) -> capacitylines.Budget:
    return next(b for b in p.budgets if b.api == api and b.scope == scope)


def test_docs_capacity_is_what_the_planner_prints(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/capacity.md is `copier plan --doc` at the repository's files: its numbers cannot drift from the planner."""
    assert main(["plan", "--doc"]) == 0
    assert capsys.readouterr().out == (ROOT / "docs" / "capacity.md").read_text(encoding="utf-8")


def test_write_units_come_from_the_measured_cost_table(tmp_path: Path) -> None:
    """The state table's writes are benchmarks.json's write units per million around the chunk's size: double
    them, the writes and their budget double."""
    before = _plan()

    def double(raw: dict[str, Any]) -> None:
        table = raw["cost"]["copier_units_per_million"]
        table.update({k: 2 * v for k, v in table.items()})

    after = _plan(_edited(tmp_path, double))
    assert _line(after, "state table writes") == pytest.approx(2 * _line(before, "state table writes"))
    assert _budget(after, "state table writes", "table").rate == pytest.approx(
        2 * _budget(before, "state table writes", "table").rate
    )


def test_a_chunk_between_measured_batches_costs_between_them() -> None:
    """per_chunk: a measured batch's own value; between two, linear in 1/batch (a cost a chunk plus a cost an
    event); past the largest, the largest's; below the smallest, more than the smallest's."""
    measured = {10: 200_000.0, 100: 30_000.0, 1000: 12_000.0}
    assert per_chunk(measured, 100) == (30_000.0, [100, 1000])
    assert per_chunk(measured, 10)[0] == pytest.approx(200_000.0)
    value, used = per_chunk(measured, 500)
    assert used == [100, 1000] and value == pytest.approx(12_000 + (1 / 500 - 1 / 1000) / (1 / 100 - 1 / 1000) * 18_000)
    assert per_chunk(measured, 5000) == (12_000.0, [1000])
    assert per_chunk(measured, 5)[0] > 200_000.0


def test_cpu_and_memory_come_from_the_measured_rows(tmp_path: Path) -> None:
    """A host's CPU follows the measured µs an event of the workload's cell and the idle host's CPU, its memory
    the measured processor and window figures: change them in a copy of benchmarks.json, the plan follows."""
    before = _plan()

    def slower(raw: dict[str, Any]) -> None:
        for row in raw["cpu"]:
            for key in ("copier_us_per_event", "uncoalesced_us_per_event"):
                row[key] = None if row[key] is None else row[key] * 3
        for row in raw["host"]:
            row["processor_pss_mb"] += 100
            row["idle_cpu_percent"] += 10  # a tenth of a core more, whatever the shards
        for row in raw["window"]:
            row["bytes_per_id"] *= 2

    after = _plan(_edited(tmp_path, slower))
    assert after.copier_us_per_event == pytest.approx(3 * before.copier_us_per_event)
    per_shard = before.events_per_shard_s * before.copier_us_per_event * 2 / 1e6
    assert after.host_cpu_cores - before.host_cpu_cores == pytest.approx(before.shards_per_host * per_shard + 0.1)
    assert after.host_memory_gib > before.host_memory_gib + before.shards_per_host * 100e6 / 1024**3 * 0.99
    assert dict(after.figures)["max(window[].bytes_per_id)"] == pytest.approx(
        2 * dict(before.figures)["max(window[].bytes_per_id)"]
    )


def test_hosts_follow_the_measured_daemon_memory(tmp_path: Path) -> None:
    """More daemon memory a shard (benchmarks.json host[].daemon.pss_mb) means fewer shards a host, more hosts."""
    before = _plan(events_per_s=1e11 / DAY, instance="m7a.xlarge")

    def heavier(raw: dict[str, Any]) -> None:
        top = max(raw["host"], key=lambda r: r["shards"])
        top["daemon"]["pss_mb"] += 64 * 100  # 100 MB more a shard between the two rows: memory binds

    after = _plan(_edited(tmp_path, heavier), events_per_s=1e11 / DAY, instance="m7a.xlarge")
    assert after.hosts > before.hosts


def test_describe_stream_summary_rate_follows_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """The application's hosts share one answer per stream in the state table, refreshed every mean_refresh_s on
    average: the account's rate is 2 / that, whatever the hosts and shards; each host reads the item once per
    refresh; the refresh the code uses is the one the plan uses."""
    p = _plan(events_per_s=1e11 / DAY)
    summary = _budget(p, "DescribeStreamSummary", "account")
    assert summary.rate == pytest.approx(2 / mean_refresh_s())
    assert _budget(p, "GetItem (a stream's answer)", "item").rate == pytest.approx(p.hosts / mean_refresh_s())
    assert p.hosts > 1 and p.start_summary_calls == 2
    assert summary.flagged == (summary.rate > 10)
    monkeypatch.setattr(capacitylines, "mean_refresh_s", lambda: mean_refresh_s() * 2)
    assert _budget(_plan(events_per_s=1e11 / DAY), "DescribeStreamSummary", "account").rate == pytest.approx(
        summary.rate / 2
    )


def test_list_shards_rate_grows_with_hosts_times_pages_not_the_square_of_the_shards() -> None:
    """Each host lists the whole target (a page per 1,000 shards) every SHARD_MAP_MAX_AGE_S for its processors
    (one shared map, as the Kinesis adapter keeps it): 20,000 shards on their hosts stay within a tenth of the
    stream's 1,000 a second (each processor listing for itself: 1,333 a second, over the limit)."""
    for shards in (1000, 10_000, 20_000):
        p = _plan(events_per_s=1e11 / DAY, shards=shards)
        rate = _budget(p, "ListShards", "stream").rate
        assert rate == pytest.approx(p.hosts * math.ceil(shards / LIST_SHARDS_PAGE) / SHARD_MAP_MAX_AGE_S)
        assert rate < shards * math.ceil(shards / LIST_SHARDS_PAGE) / SHARD_MAP_MAX_AGE_S / 10
    assert _budget(_plan(events_per_s=1e11 / DAY, shards=20_000), "ListShards", "stream").share < 0.1


def test_lease_writes_follow_the_properties(tmp_path: Path) -> None:
    """The KCL renews a lease every third of failoverTimeMillis: the properties file's value sets the lease writes."""
    measured, prices, settings = command.load(command.BENCHMARKS, command.PRICES, command.PROPERTIES)
    text = command.PROPERTIES.read_text(encoding="utf-8").replace(
        "failoverTimeMillis = 10000", "failoverTimeMillis = 30000"
    )
    assert "failoverTimeMillis = 30000" in text
    (tmp_path / "p.properties").write_text(text, encoding="utf-8")
    slow = command.load(command.BENCHMARKS, command.PRICES, tmp_path / "p.properties")[2]
    w = Workload(events_per_s=1e10 / DAY, record_bytes=200, instance="m7a.4xlarge")
    fast_plan, slow_plan = plan(w, settings, measured, prices), plan(w, slow, measured, prices)
    renewals = fast_plan.shards * (3 / 10 - 3 / 30)
    fast, slow_rate = (_budget(x, "KCL lease table writes", "table").rate for x in (fast_plan, slow_plan))
    assert fast - slow_rate == pytest.approx(renewals)


def test_default_shards_keep_producers_within_half_a_shard() -> None:
    """The default staging shard count is the fewest with producers' records and bytes at most half a shard's."""
    for size in (200, 2048):
        w = Workload(events_per_s=1e11 / DAY, record_bytes=size)
        shards = default_shards(w)
        load = max(w.events_per_s / shards / 1000, w.events_per_s * size / shards / 1024**2)
        fewer = max(w.events_per_s / (shards - 1) / 1000, w.events_per_s * size / (shards - 1) / 1024**2)
        assert load <= 0.5 < fewer


def test_prices_come_from_the_price_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--prices FILE: each line's cost is the table's price; doubling the write price doubles that line."""
    raw = json.loads(command.PRICES.read_text(encoding="utf-8"))
    raw["dynamodb"]["write_request_units_per_million"] *= 2
    (tmp_path / "prices.json").write_text(json.dumps(raw), encoding="utf-8")
    args = ["plan", "--events-per-day", "1e10", "--instance", "m7a.4xlarge", "--json"]
    assert main(args) == 0
    before = json.loads(capsys.readouterr().out)
    assert main([*args, "--prices", str(tmp_path / "prices.json")]) == 0
    after = json.loads(capsys.readouterr().out)
    cost = {x["name"]: x["usd_day"] for x in before["lines"]}, {x["name"]: x["usd_day"] for x in after["lines"]}
    assert cost[1]["state table writes"] == pytest.approx(2 * cost[0]["state table writes"])
    assert cost[1]["hosts (m7a.4xlarge)"] == cost[0]["hosts (m7a.4xlarge)"]


def test_json_says_the_budgets_and_what_it_cannot_know(capsys: pytest.CaptureFixture[str]) -> None:
    """--json: every budget with its share and flag, the measured figures used, and the unknowns."""
    assert main(["plan", "--events-per-day", "1e11", "--record-bytes", "2048", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    flagged = {(b["api"], b["scope"]) for b in out["budgets"] if b["flagged"]}
    assert ("DescribeStreamSummary", "account") not in flagged  # one answer per host, not per processor
    assert all(b["flagged"] == (b["share"] > 0.5) for b in out["budgets"])
    assert any(name.startswith("cost.copier_units_per_million[") for name in out["figures"])
    assert out["host_loss"]["read_s"] > 0 and out["host_loss"]["processors"] == out["shards_per_host"]
    assert out["unknowns"] and math.isclose(out["own_share_of_kinesis"], out["own_usd_day"] / out["kinesis_usd_day"])


def test_regions_split_the_account_budgets() -> None:
    """Spread over two regions, each region's account sees only its own application's DescribeStreamSummary calls
    (one answer per stream and refresh), and each region's state table only its own hosts' reads of them."""
    one = _plan(events_per_s=1e11 / DAY, shards=2000)
    two = _plan(events_per_s=1e11 / DAY, regions=2, shards=2000)
    assert (one.shards, two.shards) == (2000, 1000)
    for p in (one, two):
        assert _budget(p, "DescribeStreamSummary", "account").rate == pytest.approx(2 / mean_refresh_s())
        assert _budget(p, "GetItem (a stream's answer)", "item").rate == pytest.approx(p.hosts / mean_refresh_s())
    assert two.hosts <= one.hosts
    assert sum(x.usd_day for x in two.lines if not x.own) == pytest.approx(one.kinesis_usd_day)


def test_a_bad_workload_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A value the planner cannot use is said in one line (exit 2), like any other bad argument."""
    assert main(["plan", "--events-per-day", "1e9", "--duplicates", "1.5"]) == 2
    assert "duplicate rate" in capsys.readouterr().err
    assert main(["plan"]) == 2
    assert "--events-per-day" in capsys.readouterr().err


def test_fanout_reads_by_subscription() -> None:
    """FANOUT: no GetRecords budget, a SubscribeToShard every 5 minutes a shard, and the fan-out lines are copier's."""
    p = _plan(retrieval="FANOUT")
    apis = {b.api for b in p.budgets}
    assert "GetRecords" not in apis and "SubscribeToShard" in apis
    assert {x.name for x in p.lines if x.own} >= {"fan-out consumer", "fan-out retrieval"}


def test_a_host_loss_reads_the_target_over_the_verification_span(tmp_path: Path) -> None:
    """A successor verifies a chunk in flight by reading its target shards from the chunk's start to its writer's
    lease end plus the put timeout and the clock margin (copier.shard.inflight): a longer copier.leaseMillis reads
    more of each target shard; each target shard is read by the lost host's processors in proportion; and each
    successor loads its window, within a partition's and the table's read limits."""
    text = command.PROPERTIES.read_text(encoding="utf-8") + "\ncopier.leaseMillis = 20000\n"
    (tmp_path / "p.properties").write_text(text, encoding="utf-8")
    measured, prices, settings = command.load(command.BENCHMARKS, command.PRICES, command.PROPERTIES)
    longer = command.load(command.BENCHMARKS, command.PRICES, tmp_path / "p.properties")[2]
    assert (settings.verify_span_s, longer.verify_span_s) == (10 + 5 + 2, 20 + 5 + 2)
    w = Workload(events_per_s=1e11 / DAY, record_bytes=2048, instance="m7a.4xlarge")
    short, long = plan(w, settings, measured, prices), plan(w, longer, measured, prices)
    assert short.host_loss is not None and long.host_loss is not None
    assert long.host_loss.bytes_a_reader / short.host_loss.bytes_a_reader == pytest.approx(27 / 17)
    loss = short.host_loss
    assert loss.processors == short.shards_per_host
    assert loss.readers_a_target_shard == pytest.approx(
        short.shards_per_host * loss.target_shards_a_chunk / short.shards
    )
    assert loss.read_s >= loss.readers_a_target_shard * loss.bytes_a_reader / (2 * 1024**2)
    window_units = min(short.events_per_shard_s * 0.97 * 3600, settings.window_max_events) * 10 / 4096
    assert loss.window_read_units == pytest.approx(window_units)  # 10 bytes an ID, strongly consistent reads
    assert loss.window_read_s == pytest.approx(max(window_units / 3000, loss.processors * window_units / 40_000))
    assert short.start_window_read_s == pytest.approx(short.shards * window_units / 40_000)


def test_a_file_it_cannot_read_names_the_flag_to_give(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An installed copier has no docs/benchmarks.json: the one line says which flag gives it (exit 2)."""
    assert main(["plan", "--events-per-day", "1e9", "--benchmarks", str(tmp_path / "none.json")]) == 2
    assert "--benchmarks FILE" in capsys.readouterr().err


def test_the_price_table_is_dated_and_cites_its_pages() -> None:
    """The shipped price table says its region and month (in its name too) and the AWS pricing pages it is from."""
    prices = json.loads(command.PRICES.read_text(encoding="utf-8"))
    assert command.PRICES.name == f"prices-{prices['region']}-{prices['date']}.json"
    assert prices["sources"] and all(url.startswith("https://aws.amazon.com/") for url in prices["sources"])
    assert {"kinesis", "dynamodb", "instances"} <= set(prices)


def test_digests_are_kept_for_the_window_and_the_staging_retention() -> None:
    """A digest batch lives the window plus the staging retention plus an hour, at least copier.digestTtlHours
    (48): 10 bytes an event and an item's 100 bytes a chunk, for that long (docs/protocol.md, "Limits")."""
    short, long = _plan(retention_hours=24), _plan(retention_hours=72)
    assert long.state_storage_gib / short.state_storage_gib == pytest.approx((1 + 72 + 1) / 48)
    forwarded = short.events_per_shard_s * 0.97
    chunks = short.events_per_shard_s / short.chunk_events
    expected = short.shards * 48 * 3600 * (forwarded * 10 + chunks * 100) / 1024**3
    assert short.state_storage_gib == pytest.approx(expected)
