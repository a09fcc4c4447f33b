"""The plots of docs/benchmarks.md (``copier.bench.report`` writes its text), drawn with matplotlib.

Each plot is a part's figures against what it is measured against in the
same run; every linear y axis starts at 0 (:func:`save`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["draw", "save"]


def save(fig: Any, path: Path, plt: Any) -> None:
    """Write ``fig`` with every linear y axis from 0: an axis cut to the data's range makes a run's noise
    (10.3 against 10.7 bytes an ID, 31 against 35 µs) look like a trend."""
    for ax in fig.axes:
        if ax.get_yscale() == "linear":
            ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cpu_plot(cpu: list[dict[str, Any]], out: Path, plt: Any) -> None:
    """Section 1: CPU per event of copier and the plain copier, by batch size and payload."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for payload in sorted({r["payload_bytes"] for r in cpu}):
        rows = sorted((r for r in cpu if r["payload_bytes"] == payload), key=lambda r: r["batch"])
        batches = [r["batch"] for r in rows]
        ax.plot(batches, [r["plain_us_per_event"] for r in rows], "o--", label=f"plain copier, {payload} B")
        ax.plot(batches, [r["copier_us_per_event"] for r in rows], "o-", label=f"copier, {payload} B")
        alone = [(r["batch"], r["uncoalesced_us_per_event"]) for r in rows if r.get("uncoalesced_us_per_event")]
        if alone:
            ax.plot(*zip(*alone, strict=True), "x:", label=f"copier, coalescing off, {payload} B")
    ax.set(xscale="log", xlabel="events a batch", ylabel="CPU µs per event", title="Processor CPU per event")
    ax.legend()
    save(fig, out / "bench-cpu.png", plt)


def _cost_plot(cost: dict[str, Any], out: Path, plt: Any) -> None:
    """Section 2: write units per million events by batch size, against per-record idempotency."""
    fig, ax = plt.subplots(figsize=(7, 4))
    batches = [int(b) for b in cost["copier_units_per_million"]]
    ax.plot(batches, list(cost["copier_units_per_million"].values()), "o-", label="copier")
    ax.axhline(cost["per_record_idempotency_units_per_million"], color="red", ls="--", label="per-record idempotency")
    ax.set(xscale="log", yscale="log", xlabel="events a batch", ylabel="write units per 1M events")
    ax.set_title("DynamoDB write units per million forwarded events")
    ax.legend()
    save(fig, out / "bench-cost.png", plt)


def _window_plot(rows: list[dict[str, Any]], out: Path, plt: Any) -> None:
    """Section 3: the window's memory, takeover and CPU as it grows."""
    ids = [w["ids"] for w in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    axes[0].plot(ids, [w["bytes_per_id"] for w in rows], "o-", label="filled")
    axes[0].plot(ids, [w["loaded_bytes_per_id"] for w in rows], "s--", label="loaded")
    axes[0].set(xscale="log", xlabel="IDs in the window", ylabel="bytes per ID", title="Memory")
    axes[0].legend(loc="lower left")
    axes[1].plot(ids, [w["takeover_s"] for w in rows], "o-")
    axes[1].set(xscale="log", xlabel="IDs in the window", ylabel="seconds", title="Takeover (initialize)")
    axes[2].plot(ids, [w["cpu_us_per_event"] for w in rows], "o-")
    axes[2].set(xscale="log", xlabel="IDs in the window", ylabel="CPU µs per event", title="CPU per event")
    save(fig, out / "bench-window.png", plt)


def _e2e_plot(e2e: list[dict[str, Any]], out: Path, plt: Any) -> None:
    """Section 4: throughput and added latency of copier and the plain copier under the real daemon."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for kind in ("plain", "copier"):
        rows = sorted((r for r in e2e if r["kind"] == kind), key=lambda r: r["shards"])
        shards = [r["shards"] for r in rows]
        axes[0].plot(shards, [r["throughput_eps"] for r in rows], "o-", label=kind)
        axes[1].plot(shards, [r["latency_p99_ms"] for r in rows], "o-", label=f"{kind} p99")
        axes[1].plot(shards, [r["latency_p50_ms"] for r in rows], "s--", label=f"{kind} p50")
    axes[0].set(xlabel="shards", ylabel="events/s", title="Throughput")
    axes[1].set(xlabel="shards", ylabel="ms", title="Added latency")
    axes[0].legend()
    axes[1].legend()
    save(fig, out / "bench-e2e.png", plt)


def _host_plot(host: list[dict[str, Any]], out: Path, plt: Any) -> None:
    """Section 6: a many-shard host's memory, CPU and time to every shard's first event."""
    rows = sorted(host, key=lambda r: r["shards"])
    shards = [r["shards"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    axes[0].plot(shards, [r["tree"]["rss_mb"] for r in rows], "o-", label="tree RSS")
    axes[0].plot(shards, [r["tree"]["pss_mb"] for r in rows], "s--", label="tree PSS")
    axes[0].set(xlabel="shards on the host", ylabel="MB", title="Memory")
    axes[0].legend()
    axes[1].plot(shards, [r["idle_cpu_percent"] for r in rows], "o-", label="idle")
    axes[1].plot(shards, [r["steady_cpu_percent"] for r in rows], "s--", label="steady rate")
    axes[1].set(xlabel="shards on the host", ylabel="% of one core", title="CPU")
    axes[1].legend()
    axes[2].plot(shards, [r["all_first_event_s"] for r in rows], "o-")
    axes[2].set(xlabel="shards on the host", ylabel="seconds", title="Until every shard forwarded")
    save(fig, out / "bench-host.png", plt)


# Each figure: the part of the run's data it draws, and how.
_FIGURES: tuple[tuple[str, Callable[[Any, Path, Any], None]], ...] = (
    ("cpu", _cpu_plot),
    ("cost", _cost_plot),
    ("window", _window_plot),
    ("e2e", _e2e_plot),
    ("host", _host_plot),
)


def draw(data: dict[str, Any], out: Path) -> None:
    """The PNG figures of benchmarks.md in ``out``, for the parts the run measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for part, plot in _FIGURES:
        if data.get(part):
            plot(data[part], out, plt)
