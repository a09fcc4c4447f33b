"""docs/benchmarks.md, from the raw numbers of ``python -m copier.bench``; its plots are ``copier.bench.plots``.

The text states the method beside the numbers (machine, versions, the
command, what is measured and against what) and every figure as a ratio
against the baseline measured in the same run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from copier.bench.plots import draw
from copier.bench.plots import save as _save  # noqa: F401 (its name here before the plots had a module)

__all__ = ["write"]

CPU_GOAL_RATIO = 1.0  # issue 47: no more CPU per event than the plain copier in any cell, coalescing off too
CPU_GOAL_EVENTS = 30_000
COST_GOAL = 130
MEMORY_GOAL_MB = 40  # RSS of an idle copier process on the lean path
RESTART_GOAL_S = 10
FRESH_GOAL_S = 30
# Measured before the lean path and the startup settings (the week issue 25 was filed, the same machine):
# an idle copier process with boto3's clients; copier run with properties/copier.properties as shipped then,
# to the first event, and after a crash.
BEFORE = {"processor_rss_mb": 87.0, "fresh_s": 105.7, "crash_s": 180.0}
# The first rolling-deploy run (2026-11-24): a processor told lease_lost kept copier's lease, so every lease
# move was slept out, and the deploy began while the KCL was still balancing.
BEFORE_ROLLING = {"in place, own workerId": 105.4, "new worker": 161.0}
# The last full `make bench` before the host-scale work (2026-11-22, commit 2bde6e3): copier's CPU per event and
# its ratio to the plain copier, by (payload bytes, batch), and DynamoDB write units per million events by batch.
BEFORE_CPU = {
    (200, 10): (24.0, 0.17),
    (200, 100): (21.0, 0.698),
    (200, 1000): (13.67, 0.854),
    (200, 10000): (21.33, 1.123),
    (2048, 100): (49.0, 1.241),
    (2048, 1000): (34.5, 0.867),
    (2048, 10000): (41.5, 0.991),
}
BEFORE_UNITS = {"10": 200_000, "100": 30_000, "500": 14_000, "1000": 11_000, "10000": 9_900}
BEFORE_COALESCED_UNITS = {"10": 14_000, "100": 14_000}


def _cpu_table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| payload | batch | plain copier µs/event | copier µs/event | ratio | copier events/s per core "
        "| copier, coalescing off: µs/event | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        alone = r.get("uncoalesced_us_per_event")
        out.append(
            f"| {r['payload_bytes']} B | {r['batch']} | {r['plain_us_per_event']} | {r['copier_us_per_event']} | "
            f"{r['ratio']} | {r['copier_events_per_core_s']:,} | "
            + ("(same)" if alone is None else str(alone))
            + " | "
            + ("" if alone is None else str(r["uncoalesced_ratio"]))
            + " |"
        )
    return out


def _verdicts(data: dict[str, Any]) -> list[str]:
    lines = []
    goal_rows = [r for r in data["cpu"] if r["batch"] >= 100]
    if data["cpu"]:  # every cell, coalescing off included, the worst first
        alone = [(r["uncoalesced_ratio"], r, ", coalescing off") for r in data["cpu"] if r.get("uncoalesced_ratio")]
        cells = sorted([(r["ratio"], r, "") for r in data["cpu"]] + alone, key=lambda cell: -cell[0])
        named = [(ratio, f"{ratio} ({r['payload_bytes']} B, batches of {r['batch']}{how})") for ratio, r, how in cells]
        over = [name for ratio, name in named if ratio > CPU_GOAL_RATIO]
        lines.append(
            f"- CPU: worst ratio {named[0][1]} of {len(cells)} cells; goal at most {CPU_GOAL_RATIO} in every cell: "
            + (f"{len(over)} over it, " + ", ".join(over) if over else "met")
            + "."
        )
    if goal_rows:
        slowest = min(goal_rows, key=lambda r: r["copier_events_per_core_s"])
        lines.append(
            f"- CPU: slowest {slowest['copier_events_per_core_s']:,} events/s per core "
            f"({slowest['payload_bytes']} B, batches of {slowest['batch']}; goal at least {CPU_GOAL_EVENTS:,})."
        )
    if data["cost"]:
        cost = data["cost"]
        lines.append(
            "- DynamoDB: "
            + ", ".join(f"{v}x fewer write units with batches of {k}" for k, v in cost["times_fewer"].items())
            + ", and with coalescing: "
            + ", ".join(f"{v}x with batches of {k}" for k, v in cost["coalesced_times_fewer"].items())
            + f" (goal at least {COST_GOAL}x)."
        )
    lines += _sources(data.get("sources") or {})
    for row in data.get("memory", []):
        lines.append(
            f"- Memory: an idle `copier process` on the {row['path']} path holds {row['rss_mb']} MB RSS, "
            f"{row['pss_mb']} MB PSS" + (f" (goal at most {MEMORY_GOAL_MB} MB RSS)." if row["path"] == "lean" else ".")
        )
    for row in data.get("rolling", []):
        lines.append(
            f"- Rolling deploy ({row['workers']} workers, {row['shards']} shards, {row['restart']}): "
            "longest pause of a shard "
            f"{row['longest_pause_s']} s (goal at most {RESTART_GOAL_S} s), {row['lost']} lost, "
            f"{row['duplicated']} duplicated."
        )
    for row in data.get("startup", []):
        lines.append(
            f"- Start with {row['settings']} settings ({row.get('worker_id', 'new each run')} workerId), "
            f"{row['shards']} shards, to every shard's first event: "
            f"fresh lease table {row['fresh_s']} s, restart {row['restart_s']} s, crash takeover "
            f"{row['crash_s']} s (goals {FRESH_GOAL_S}, {RESTART_GOAL_S}, {FRESH_GOAL_S} s)."
        )
    return lines


def _sources(sources: dict[str, Any]) -> list[str]:
    """A redrive's and a repair's cost (``copier.bench.sources``): write units and requests per event sent."""
    lines = []
    for name in ("redrive", "repair"):
        figures = sources.get(name)
        if figures:
            events, requests = figures["events"], figures["requests"]
            lines.append(
                f"- {name.capitalize()} of {events} events: {figures['write_units_per_event']} write units an event "
                f"({figures['digest_batch_bytes_per_event']} B of digest batch), "
                f"{sum(requests.values()) / events:.4f} requests an event ({requests.get('Kinesis.PutRecords', 0)} "
                f"PutRecords, {requests.get('Kinesis.GetRecords', 0)} GetRecords)."
            )
    return lines


def _before_after(data: dict[str, Any]) -> list[str]:
    """Before and after rows for what issue 25 promised, where this run measured the after."""
    rows = []
    lean = next((r for r in data.get("memory", []) if r["path"] == "lean"), None)
    if lean:
        rows.append(f"| idle `copier process` RSS (MB) | {BEFORE['processor_rss_mb']} | {lean['rss_mb']} |")
    window = data.get("window") or []
    if window:
        rows.append(f"| bytes per remembered ID | 20 | {window[-1]['bytes_per_id']} |")
    shipped = {r.get("worker_id"): r for r in data.get("startup", []) if r["settings"] == "production"}
    new, stable = shipped.get("new each run"), shipped.get("stable")
    if new and stable:
        rows += [
            f"| first event, fresh lease table, production sample (s) | {BEFORE['fresh_s']} | {stable['fresh_s']} |",
            f"| restart after SIGTERM, production sample (s) | {new['restart_s']} | {stable['restart_s']} |",
            f"| crash, then a new daemon on the host, production sample (s) | {BEFORE['crash_s']} | "
            f"{stable['crash_s']} |",
        ]
    for row in data.get("rolling", []):
        if row["restart"] in BEFORE_ROLLING:
            rows.append(
                f"| rolling deploy, {row['restart']}: longest pause of a shard (s) | "
                f"{BEFORE_ROLLING[row['restart']]} | {row['longest_pause_s']} |"
            )
    rows += _before_after_cost(data)
    if not rows:
        return []
    return [
        "Before and after: before is the measurement that opened the work (an idle processor with boto3's",
        "clients; `copier run` with the sample properties as then shipped); for a restart, the same run with",
        "the KCL's default workerId (a new one each run); for a rolling deploy, its first run, before a",
        "processor told lease_lost released copier's lease; for CPU and write units per event, the last full",
        "`make bench` before that work (2026-11-22; sections 1 and 2). After is this run, with a stable workerId.",
        "",
        "| figure | before | after |",
        "|---|---|---|",
        *rows,
        "",
    ]


def _before_after_cost(data: dict[str, Any]) -> list[str]:
    """Rows for CPU per event (section 1) and write units per event (section 2) against ``BEFORE_CPU``/``_UNITS``."""
    rows = []
    for r in data.get("cpu", []):
        before = BEFORE_CPU.get((r["payload_bytes"], r["batch"]))
        if before:
            rows.append(
                f"| CPU per event, {r['payload_bytes']} B, batches of {r['batch']}: µs (ratio to the plain copier) | "
                f"{before[0]} ({before[1]}) | {r['copier_us_per_event']} ({r['ratio']}) |"
            )
    cost = data.get("cost") or {}
    for label, before_units, after_units in (
        ("", BEFORE_UNITS, cost.get("copier_units_per_million", {})),
        (", coalesced", BEFORE_COALESCED_UNITS, cost.get("coalesced_units_per_million", {})),
    ):
        for batch, units in after_units.items():
            if batch in before_units:
                rows.append(
                    f"| DynamoDB write units per 1,000,000 events, batches of {batch}{label} | "
                    f"{before_units[batch]:,} | {units:,} |"
                )
    return rows


def _host_section(data: dict[str, Any]) -> list[str]:
    """Section 6: memory per processor, a many-shard host, starting and restarting."""
    lines = [
        "## 6. What a shard costs a host",
        "",
        "One `copier process` runs per staging shard (`copier.bench.host`). Memory per processor: one",
        "processor after `initialize` and a batch of 100 events, on the lean path and on botocore's (forced",
        "by a shared AWS config file in its HOME). RSS counts shared library pages in every process; PSS",
        "divides them among the processes sharing them (what N processors add up to); USS is what only",
        "that process holds.",
        "",
        "| path | RSS (MB) | PSS (MB) | USS (MB) |",
        "|---|---|---|---|",
        *(f"| {r['path']} | {r['rss_mb']} | {r['pss_mb']} | {r['uss_mb']} |" for r in data.get("memory", [])),
        "",
    ]
    if data.get("host"):
        lines += [
            "A many-shard host: one `copier run` worker holding every shard (the local runs' KCL timings with",
            "the production sample's `failoverTimeMillis` 10000 and `idleTimeBetweenReadsInMillis` 1000:",
            "`copier.bench.host.HOST_KCL`), an event waiting in each when it starts; then idle (after the",
            "leases settle), then events at a steady rate spread over the shards. Memory is the whole tree's:",
            "`copier run`, the daemon JVM and every processor. CPU is the tree's, in percent of one core",
            "(the local backend runs in the benchmark's own process and is not counted).",
            "",
            "| shards | all first events (s) | tree RSS (MB) | tree PSS (MB) | daemon RSS (MB) "
            "| processor PSS (MB) | idle CPU % | steady rate (events/s) | steady CPU % | CPU µs/event |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *(
                f"| {r['shards']} | {r['all_first_event_s']} | {r['tree']['rss_mb']} | {r['tree']['pss_mb']} | "
                f"{r['daemon']['rss_mb']} | {r['processor_pss_mb']} | {r['idle_cpu_percent']} | {r['steady_rate']} | "
                f"{r['steady_cpu_percent']} | {r['steady_cpu_us_per_event']} |"
                for r in data["host"]
            ),
            "",
            "![A many-shard host](bench-host.png)",
            "",
        ]
    if data.get("startup"):
        lines += [
            "Starting and restarting: seconds from `copier run` to every shard's first event in the target,",
            "an event waiting in each shard. Fresh: a new application (no lease table). Restart: the worker",
            "stopped with SIGTERM, a new one started (the lease table exists, the leases released). Crash: the",
            "worker's process group SIGKILLed while it held every lease, a new worker started (it waits for",
            "the leases to expire, then copier sleeps out the dead owner's lease). `local` is the local runs'",
            "KCL timings (`copier.local.pipeline.FAST_KCL`); `production` is `properties/copier.properties` as",
            "shipped, pointed at the local backend. workerId: the KCL's default, a new ID for each run of the",
            "daemon, or one kept across a host's restarts (`workerId` in the properties). JVM class archive:",
            "whether the daemon JVM mapped copier's class-data archive of the KCL's classes from the first start",
            "on (`copier.jvmClassArchive`; a host's first start ever writes it when it is stopped, and starts",
            "about 1 s slower).",
            "",
            "| settings | workerId | shards | JVM class archive | fresh (s) | restart (s) | crash takeover (s) |",
            "|---|---|---|---|---|---|---|",
            *(
                f"| {r['settings']} | {r.get('worker_id', 'new each run')} | {r['shards']} | "
                f"{r.get('class_archive', 'none (before copier had one)')} | {r['fresh_s']} | "
                f"{r['restart_s']} | {r['crash_s']} |"
                for r in data["startup"]
            ),
            "",
        ]
    lines += _before_after(data)
    if data.get("rolling"):
        lines += [
            "A rolling deploy: workers of one pipeline restarted one at a time (SIGTERM, wait for the exit,",
            f"start a new worker, then wait until no shard has changed hands for {_settle(data)} s; the deploy "
            "starts once",
            "the KCL's first balancing has settled the same way) while events arrive at a steady rate spread",
            "over the shards. A shard's pause is the longest gap between consecutive arrivals in the target of",
            "its events during the deploy; every event written is counted in the target (lost: never arrived;",
            "duplicated: arrived more than once). *Began*: when the longest pause began, in seconds from the",
            "SIGTERM of the restart it belongs to (the last one before it ended; negative: before the SIGTERM).",
            "",
            "| workers | restarted as | shards | events/s | events | longest pause (s) | began | median shard's "
            "pause (s) | lost | duplicated |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *(
                f"| {r['workers']} | {r['restart']} | {r['shards']} | {r['rate']} | {r['events']:,} | "
                f"{r['longest_pause_s']} | {_began(r)} | "
                f"{r['median_pause_s']} | {r['lost']} | {r['duplicated']} |"
                for r in data["rolling"]
            ),
            "",
        ]
    return lines


def _settle(data: dict[str, Any]) -> Any:
    return data["rolling"][0].get("settle_s", "the given")


def _began(row: dict[str, Any]) -> str:
    """When a rolling deploy's longest pause began, if the run recorded it."""
    if row.get("longest_pause_from_sigterm_s") is None:
        return "-"
    return f"{row['longest_pause_from_sigterm_s']:+} s from restart {row['longest_pause_restart']}'s SIGTERM"


def _on_code(run: dict[str, Any]) -> str:
    """Which copier a run measured: the code digest a chaos seed's result carries (none before it was kept)."""
    return f", on code digest `{run['code']}`" if run.get("code") else ""


def write(data: dict[str, Any], out: Path) -> None:
    """benchmarks.md and its PNG figures in ``out``."""
    from copier.bench.sim.report import markdown as simulation_section

    method = data["method"]
    machine, versions = method["machine"], method["versions"]
    lines = [
        "# Benchmarks",
        "",
        f"Command: `{method['command']}` (`make bench`), {method['date']}, {method.get('minutes', '?')} minutes"
        f"{_on_code(method)}.",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}, {machine['platform']}.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        "Raw numbers: `docs/benchmarks.json`. Every comparison is a ratio against a baseline measured in the",
        "same run, on the same local backend (moto behind one lock, on this machine): absolute times say",
        "little about AWS, the ratios are the point.",
        "",
        "## Summary",
        "",
        *_verdicts(data),
        "",
        "## 1. Processor CPU per event",
        "",
        "Both processors are driven over their pipes exactly as the KCL daemon drives them",
        "(`copier.local.multilang`), against the same backend: `copier process`, and a plain at-least-once",
        "amazon-kclpy copier (`copier.bench.plain`: PutRecords, checkpoints, no event IDs, no state). What is",
        "measured is the processor process's own user + system CPU over the measured batches, divided by the",
        "events; runs rotate between the processors, repeat, and the medians are shown (a ratio is the median",
        "of the per-repetition ratios against the plain copier). Events are JSON with a UUID event ID, and",
        "each record's partition key hashes to the shard it is delivered on, as Kinesis routes it (the event",
        "ID, suffixed when needed: `copier.bench.cpu.key_in`).",
        "copier coalesces deliveries smaller than `copier.coalesceEvents` (500) by default: for those batch",
        "sizes it is also measured with coalescing off, each delivery forwarded and committed alone.",
        "",
        *_cpu_table(data["cpu"]),
        "",
    ]
    lines += ["![CPU per event](bench-cpu.png)", ""]
    if data["cost"]:
        cost = data["cost"]
        lines += [
            "## 2. DynamoDB write units per 1,000,000 forwarded events",
            "",
            "From the billed sizes of the requests the backend received (moto's request recorder;",
            "`copier.local.billing`: item sizes, 1 KB units, an UpdateItem at the larger of the item before and",
            "after). Per-record idempotency is what AWS Lambda Powertools' idempotency utility does per event: a",
            "conditional PutItem of an `INPROGRESS` record, then an UpdateItem to `COMPLETED` with the result.",
            f"Measured over {cost['events_per_case']:,} events per case. copier's rows are each delivery forwarded",
            "alone (coalescing off), then the small deliveries again as configured by default (coalesced). The",
            "application's DescribeStreamSummary answers in the state table (a turn and an answer per stream every",
            "2.4 to 4.8 minutes, for all hosts at once) are left out: they are the application's, not an event's.",
            "",
            "The billing model is held to an implementation of DynamoDB the project did not write:",
            "`tests/test_billing_crosscheck.py` sends the same kinds of requests (the state store's own: a takeover,",
            "digest batches up to about 390 KB, commits, writes refused by their condition, the release, GetItem,",
            "BatchGetItem and Query; this baseline's put and update, by its own code; an item of every DynamoDB type",
            "padded to a unit boundary; items up to the 400 KB limit, read strongly and eventually consistent) to",
            "dynalite with `ReturnConsumedCapacity=TOTAL`, and runs a real `copier process` (a takeover, deliveries",
            "of 1, 50 and 500 events) with a proxy asking dynalite the same of each of its state-table requests,",
            "where the sum this section takes (`billed_writes`) must equal dynalite's. Each request's units agree",
            "with the model's but for one difference, where AWS's documentation decides and the test asserts the",
            "difference exactly: dynalite sizes a string by its UTF-16 code units, DynamoDB by its UTF-8 bytes",
            "([Item sizes and formats](https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/"
            "CapacityUnitCalculations.html)), so a non-ASCII string weighs less there (copier's items are ASCII).",
            "A write refused by its condition is billed by DynamoDB",
            "([conditional writes](https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/"
            "WorkingWithItems.html#WorkingWithItems.ConditionalWrites.ReturnConsumedCapacity)) and reported by",
            "neither (an error carries no `ConsumedCapacity`): the model bills it at the larger of the item and the",
            "refused one, as [Read and write operations](https://docs.aws.amazon.com/amazondynamodb/latest/"
            "developerguide/read-write-operations.html) says (the conditional-writes page says the stored item, or",
            "1 unit: the model takes the upper of the two), and leaves the item as it was. A number is sized as",
            "dynalite sizes it, its significant digits paired from the decimal point: the exact form of AWS's",
            '"approximately 1 byte per two significant digits, plus 1 byte". The figures above count write units:',
            "the model's read units are checked there too, but are not part of this table.",
            "",
            "| batch delivered | copier | per-record idempotency | times fewer |",
            "|---|---|---|---|",
            *(
                f"| {b} | {cost['copier_units_per_million'][b]:,} | "
                f"{cost['per_record_idempotency_units_per_million']:,} | {cost['times_fewer'][b]} |"
                for b in cost["copier_units_per_million"]
            ),
            *(
                f"| {b}, coalesced | {cost['coalesced_units_per_million'][b]:,} | "
                f"{cost['per_record_idempotency_units_per_million']:,} | {cost['coalesced_times_fewer'][b]} |"
                for b in cost["coalesced_units_per_million"]
            ),
            "",
        ]
        lines += ["![Write units per million events](bench-cost.png)", ""]
    if data["window"]:
        lines += [
            "## 3. The dedup window",
            "",
            "Memory: a window filled a second of arrivals at a time, as a shard at 1,000 events/s fills it.",
            "Takeover: the IDs written as a shard's committed digest batches (10,000 a batch), then a real",
            "`copier process` takes the shard over; `initialize` is what the daemon waits for, the load is what",
            "the processor logs (`window_loaded`). CPU: that processor then forwards new events (200 B, batches",
            "of 1,000) with the window loaded.",
            "",
            "| IDs | bytes/ID (filled) | bytes/ID (loaded) | initialize (s) | load (s) | CPU µs/event |",
            "|---|---|---|---|---|---|",
            *(
                f"| {w['ids']:,} | {w['bytes_per_id']} | {w['loaded_bytes_per_id']} | {w['takeover_s']} | "
                f"{w['load_s']} | {w['cpu_us_per_event']} |"
                for w in data["window"]
            ),
            "",
        ]
        lines += ["![The window as it grows](bench-window.png)", ""]
    if data["e2e"]:
        lines += [
            "## 4. End to end with the real daemon",
            "",
            "One `copier run` worker (the KCL MultiLangDaemon) per run, the same daemon settings for both",
            "processors (`copier.local.pipeline.FAST_KCL`). Latency: events written at a steady rate; an event's",
            "added latency is its arrival in the target minus its arrival in staging (both stamped by the backend).",
            "Throughput: a burst, from its first arrival in staging to its last in the target.",
            "",
            "| processor | shards | throughput (events/s) | latency p50 (ms) | latency p99 (ms) |",
            "|---|---|---|---|---|",
            *(
                f"| {r['kind']} | {r['shards']} | {r['throughput_eps']} | {r['latency_p50_ms']} | "
                f"{r['latency_p99_ms']} |"
                for r in data["e2e"]
            ),
            "",
        ]
        lines += ["![End to end](bench-e2e.png)", ""]
    if data.get("ordering"):
        base = {r["keys"]: r["events_per_s"] for r in data["ordering"] if r["ordering"] == "none"}
        lines += [
            "## 5. Order per partition key",
            "",
            "`copier.ordering = partitionKey` sends only the earliest unlanded event of each key in a round of",
            "PutRecords; `none` sends everything at once. The same events through a real `copier process`",
            "(deliveries of 1,000, coalescing off), no faults: with distinct keys both need one round per",
            "chunk; with hot keys partitionKey needs as many rounds as the busiest key has events in a chunk.",
            "",
            "| keys | ordering | events | seconds | events/s | against none |",
            "|---|---|---|---|---|---|",
            *(
                f"| {r['keys']} | {r['ordering']} | {r['events']:,} | {r['seconds']} | {r['events_per_s']:,} | "
                f"{r['events_per_s'] / base[r['keys']]:.2f} |"
                for r in data["ordering"]
                if base.get(r["keys"])
            ),
            "",
        ]
    if data.get("memory") or data.get("host") or data.get("startup") or data.get("rolling"):
        lines += _host_section(data)
    lines += simulation_section(data.get("simulation") or {})
    for rerun in method.get("reruns", []):
        lines.insert(
            3,
            f"Parts run again since: `{rerun['command']}`, {rerun['date']}, {rerun['minutes']} minutes"
            f"{_on_code(rerun)}.",
        )
    (out / "benchmarks.md").write_text("\n".join(lines))
    draw(data, out)
