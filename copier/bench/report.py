"""docs/benchmarks.md and its plots, from the raw numbers of ``python -m copier.bench``.

The text states the method beside the numbers (machine, versions, the
command, what is measured and against what) and every figure as a ratio
against the baseline measured in the same run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write"]

CPU_GOAL_RATIO = 1.25
CPU_GOAL_EVENTS = 30_000
COST_GOAL = 130


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
    if goal_rows:
        worst = max(goal_rows, key=lambda r: r["ratio"])
        slowest = min(goal_rows, key=lambda r: r["copier_events_per_core_s"])
        lines.append(
            f"- CPU: worst ratio {worst['ratio']} ({worst['payload_bytes']} B, batches of {worst['batch']}; "
            f"goal at most {CPU_GOAL_RATIO}); slowest {slowest['copier_events_per_core_s']:,} events/s per core "
            f"({slowest['payload_bytes']} B, batches of {slowest['batch']}; goal at least {CPU_GOAL_EVENTS:,})."
        )
        alone = [r for r in goal_rows if r.get("uncoalesced_ratio") is not None]
        if alone:
            worst_alone = max(alone, key=lambda r: r["uncoalesced_ratio"])
            lines.append(
                f"- CPU with coalescing off: worst ratio {worst_alone['uncoalesced_ratio']} "
                f"({worst_alone['payload_bytes']} B, batches of {worst_alone['batch']})."
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
    return lines


def write(data: dict[str, Any], out: Path) -> None:
    """benchmarks.md and its PNG figures in ``out``."""
    method = data["method"]
    machine, versions = method["machine"], method["versions"]
    lines = [
        "# Benchmarks",
        "",
        f"Command: `{method['command']}` (`make bench`), {method['date']}, {method.get('minutes', '?')} minutes.",
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
        "of the per-repetition ratios against the plain copier). Events are JSON with a UUID event ID.",
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
            "alone (coalescing off), then the small deliveries again as configured by default (coalesced).",
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
    (out / "benchmarks.md").write_text("\n".join(lines))
    _plots(data, out)


def _plots(data: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for payload in sorted({r["payload_bytes"] for r in data["cpu"]}):
        rows = sorted((r for r in data["cpu"] if r["payload_bytes"] == payload), key=lambda r: r["batch"])
        batches = [r["batch"] for r in rows]
        ax.plot(batches, [r["plain_us_per_event"] for r in rows], "o--", label=f"plain copier, {payload} B")
        ax.plot(batches, [r["copier_us_per_event"] for r in rows], "o-", label=f"copier, {payload} B")
        alone = [(r["batch"], r["uncoalesced_us_per_event"]) for r in rows if r.get("uncoalesced_us_per_event")]
        if alone:
            ax.plot(*zip(*alone, strict=True), "x:", label=f"copier, coalescing off, {payload} B")
    ax.set(xscale="log", xlabel="events a batch", ylabel="CPU µs per event", title="Processor CPU per event")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "bench-cpu.png", dpi=110)
    plt.close(fig)

    if data["cost"]:
        cost = data["cost"]
        fig, ax = plt.subplots(figsize=(7, 4))
        batches = [int(b) for b in cost["copier_units_per_million"]]
        ax.plot(batches, list(cost["copier_units_per_million"].values()), "o-", label="copier")
        ax.axhline(
            cost["per_record_idempotency_units_per_million"], color="red", ls="--", label="per-record idempotency"
        )
        ax.set(xscale="log", yscale="log", xlabel="events a batch", ylabel="write units per 1M events")
        ax.set_title("DynamoDB write units per million forwarded events")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "bench-cost.png", dpi=110)
        plt.close(fig)

    if data["window"]:
        rows = data["window"]
        ids = [w["ids"] for w in rows]
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
        axes[0].plot(ids, [w["bytes_per_id"] for w in rows], "o-", label="filled")
        axes[0].plot(ids, [w["loaded_bytes_per_id"] for w in rows], "s--", label="loaded")
        axes[0].set(xscale="log", xlabel="IDs in the window", ylabel="bytes per ID", title="Memory")
        axes[0].legend()
        axes[1].plot(ids, [w["takeover_s"] for w in rows], "o-")
        axes[1].set(xscale="log", xlabel="IDs in the window", ylabel="seconds", title="Takeover (initialize)")
        axes[2].plot(ids, [w["cpu_us_per_event"] for w in rows], "o-")
        axes[2].set(xscale="log", xlabel="IDs in the window", ylabel="CPU µs per event", title="CPU per event")
        fig.tight_layout()
        fig.savefig(out / "bench-window.png", dpi=110)
        plt.close(fig)

    if data["e2e"]:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for kind in ("plain", "copier"):
            rows = sorted((r for r in data["e2e"] if r["kind"] == kind), key=lambda r: r["shards"])
            shards = [r["shards"] for r in rows]
            axes[0].plot(shards, [r["throughput_eps"] for r in rows], "o-", label=kind)
            axes[1].plot(shards, [r["latency_p99_ms"] for r in rows], "o-", label=f"{kind} p99")
            axes[1].plot(shards, [r["latency_p50_ms"] for r in rows], "s--", label=f"{kind} p50")
        axes[0].set(xlabel="shards", ylabel="events/s", title="Throughput")
        axes[1].set(xlabel="shards", ylabel="ms", title="Added latency")
        axes[0].legend()
        axes[1].legend()
        fig.tight_layout()
        fig.savefig(out / "bench-e2e.png", dpi=110)
        plt.close(fig)
