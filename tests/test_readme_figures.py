"""README's measured figures are the ones docs/benchmarks.json holds, so none can go stale again.

Seen: README quoted a 117.5 s takeover for the demo while the demo showed
6-7 s, and "2-4 minutes" for a demo that takes less. Every figure README's
"Performance and cost" and "Ordering" paragraphs quote is rendered here from
the json that ``make bench`` writes (``copier.bench``), and must appear in
README as rendered: a new benchmark run that moves a figure fails this test
until README says the new one. The demo's own figures (how long a takeover
took, how long the run took) are the demo's output: README names them, and
quotes none.
"""

from __future__ import annotations

import json
import re
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def text(path: str) -> str:
    """The file with its line breaks and runs of spaces as one space (README wraps its paragraphs anywhere)."""
    return re.sub(r"\s+", " ", (ROOT / path).read_text(encoding="utf-8"))


def fixed(value: float, places: int = 0, rounding: str = ROUND_HALF_UP) -> str:
    """A figure as README writes it: ``places`` decimals, thousands with a comma (from the json's decimal text:
    1.165 is 1.17, as a person rounds it)."""
    quantum = Decimal(1).scaleb(-places)
    return f"{Decimal(str(value)).quantize(quantum, rounding=rounding):,}"


def span(values: list[float], places: int = 0, outward: bool = False) -> str:
    """``low to high`` (rounded outward when ``outward``: the whole range inside the figures), or one figure."""
    low = fixed(min(values), places, ROUND_FLOOR if outward else ROUND_HALF_UP)
    high = fixed(max(values), places, ROUND_CEILING if outward else ROUND_HALF_UP)
    return low if low == high else f"{low} to {high}"


def hundreds(value: float, step: int) -> str:
    return f"{round(value / step) * step:,}"


def phrases(bench: dict[str, Any]) -> list[str]:
    """Every README sentence part that quotes the json, rendered from it."""
    cpu, cost, window = bench["cpu"], bench["cost"], bench["window"]
    small, large = ([r for r in cpu if r["payload_bytes"] == size] for size in (200, 2048))
    big_batches = [r["ratio"] for r in cpu if r["batch"] >= 1000]
    uncoalesced = [r["uncoalesced_ratio"] for r in cpu if r["uncoalesced_ratio"] is not None]
    large_rates = [r["copier_events_per_core_s"] for r in large]
    memory = {r["path"]: r for r in bench["memory"]}
    host = {r["shards"]: r for r in bench["host"]}
    start = {(r["settings"], r["worker_id"]): r for r in bench["startup"]}
    rolling = {r["restart"]: r for r in bench["rolling"]}
    in_place, new = rolling["in place, own workerId"], rolling["new worker"]
    order = {(r["keys"], r["ordering"]): r["events_per_s"] for r in bench["ordering"]}
    e2e = {kind: [r for r in bench["e2e"] if r["kind"] == kind] for kind in ("plain", "copier")}
    return [
        f"{span(big_batches, 2)} times the CPU per event",
        f"({span(uncoalesced, 2)} times with coalescing off)",
        f"200-byte events cost {span([r['copier_us_per_event'] for r in small], outward=True)} µs each",
        f"({span([round(r['copier_events_per_core_s'], -3) for r in small])} events/s per core)",
        f"2 KB events {span([r['copier_us_per_event'] for r in large], outward=True)} µs",
        f"({hundreds(min(large_rates), 100)} to {hundreds(max(large_rates), 100)} events/s per core)",
        f"the plain copier {span([r['plain_us_per_event'] for r in large], outward=True)}:",
        f"about {fixed(cost['copier_units_per_million']['500'])} write units per million events",
        f"{fixed(cost['copier_units_per_million']['10000'])} with 10,000-event ones",
        f"{fixed(cost['times_fewer']['500'])} to {fixed(cost['times_fewer']['10000'])} times fewer",
        f"per event, {fixed(cost['per_record_idempotency_units_per_million'])})",
        f"({fixed(cost['copier_units_per_million']['10'])} write units per million events with 10-event deliveries)",
        f"{span([v for r in window for v in (r['bytes_per_id'], r['loaded_bytes_per_id'])], 1)} bytes per remembered",
        f"loads 3.6 million IDs in {fixed(window[-1]['load_s'], 1)} s and 1.2 million in "
        f"{fixed(next(r['load_s'] for r in window if r['ids'] == 1_200_000), 1)} s",
        f"holds {fixed(memory['lean']['rss_mb'])} MB RSS ({fixed(memory['lean']['pss_mb'])} MB PSS)",
        f"{fixed(memory['botocore']['rss_mb'])} MB with botocore's clients",
        f"the daemon JVM about {fixed(host[8]['daemon']['rss_mb'])} MB holding 8 shards",
        f"plus about {fixed((host[64]['daemon']['rss_mb'] - host[8]['daemon']['rss_mb']) / (64 - 8))} MB a shard",
        f"One worker holding 64 shards: {fixed(host[64]['tree']['rss_mb'] / 1024, 1)} GB RSS in all, "
        f"{fixed(host[64]['idle_cpu_percent'])}% of a core idle",
        f"forwards again in about {fixed(start['production', 'stable']['restart_s'])} s after a SIGTERM and "
        f"{fixed(start['production', 'stable']['crash_s'])} s after a crash "
        f"({fixed(start['production', 'new each run']['restart_s'])} s and "
        f"{fixed(start['production', 'new each run']['crash_s'])} s with the KCL's default",
        f"first start takes about {fixed(start['production', 'stable']['fresh_s'])} s",
        f"paused the longest shard {fixed(in_place['longest_pause_s'], 1)} s in place and "
        f"{fixed(new['longest_pause_s'], 1)} s with new workers (median {fixed(in_place['median_pause_s'], 1)} "
        f"and {fixed(new['median_pause_s'], 1)} s",
        f"p50 {span([r['latency_p50_ms'] for r in e2e['copier']])} ms against the plain copier's "
        f"{span([r['latency_p50_ms'] for r in e2e['plain']])} ms, "
        f"p99 {span([r['latency_p99_ms'] for r in e2e['copier']])} ms against "
        f"{span([r['latency_p99_ms'] for r in e2e['plain']])}",
        f"distinct keys, {fixed(order['distinct', 'partitionKey'])} events/s with `partitionKey` against "
        f"{fixed(order['distinct', 'none'])} with `none`",
        f"20 hot keys (50 events of each key per chunk), {fixed(order['hot (20 keys)', 'partitionKey'])} against "
        f"{fixed(order['hot (20 keys)', 'none'])} events/s",
    ]


def test_every_figure_readme_quotes_from_the_benchmarks_is_the_one_in_benchmarks_json() -> None:
    bench = json.loads((ROOT / "docs/benchmarks.json").read_text(encoding="utf-8"))
    readme = text("README.md")
    missing = [phrase for phrase in phrases(bench) if phrase not in readme]
    assert not missing, "README says otherwise than docs/benchmarks.json (or the sentence moved):\n" + "\n".join(
        missing
    )


def test_readme_quotes_no_figure_of_the_demo_which_prints_its_own() -> None:
    """The takeover and the whole run's time change with the machine: the demo prints both."""
    readme = text("README.md")
    demo = readme[readme.index("`make demo` starts") : readme.index("`.venv/bin/copier demo --events N")]
    quick = readme[readme.index("make demo ") : readme.index("make test ")]
    for part in (demo, quick):
        assert not re.search(r"\d+(\.\d+)? ?s\b|\d+(-| to )\d+ minutes|two to four", part), part
    assert "117.5" not in readme


def test_operations_says_how_the_kcl_3_leader_assigns_leases_with_the_settings_that_govern_it() -> None:
    """Seen: docs/operations.md said the KCL "moves leases to" a new worker and "spreads leases evenly over
    hosts", and a second worker joining an idle application got no shard for 3 minutes: the KCL 3.x leader
    balances load, not lease counts. The guide names the settings that govern it, each a key the daemon reads."""
    from copier.core.kclkeys import KCL_KEYS

    guide = text("docs/operations.md")
    assert "spreads leases evenly" not in guide and "moves leases to it" not in guide
    for key in ("leaseAssignmentIntervalMillis", "varianceBalancingFrequency", "reBalanceThresholdPercentage"):
        assert f"`{key}`" in guide and key in KCL_KEYS, key
    assert "An idle application's leases carry no throughput" in guide
