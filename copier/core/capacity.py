"""What a workload costs copier: hosts, the state table, the KCL's tables, Kinesis, and each AWS API's budget.

Pure: the measured figures (docs/benchmarks.json, as a dict), the settings (the properties file's, the
code's defaults), the price table (a dated json file) and the workload go in; a :class:`Plan` comes out.
``copier plan`` (``copier.commands.plan``) reads the files and prints it.

Where each number comes from:

* per event and per shard, what copier costs (processor CPU, write units, window and processor memory, the
  daemon's memory and idle CPU) is what ``make bench`` measured on its machine: :class:`Measured` reads it
  from the benchmarks dict and names the field each figure came from (:attr:`Plan.figures`); nothing
  measured is typed here;
* how often copier and the KCL call an API follows from the code and the settings: DescribeStreamSummary
  once per refresh per stream for the application (its hosts read the answer from the state table), a
  GetRecords every ``idleTimeBetweenReadsInMillis``,
  a lease renewal every third of ``failoverTimeMillis``;
* the limits are AWS's: the per-shard ones are :mod:`copier.core.limits`' (the ones readers pace by), the
  per-account, per-stream and per-table ones the API reference's and the service quotas pages'
  (``copier.core.capacitylines``, which turns a sizing into cost lines and budgets).

What it cannot know, and says so (:data:`UNKNOWNS`): the KCL daemon's CPU per event (measured only with
the whole host, at a few events a second a shard), how the measuring machine's cores compare with an
instance's vCPUs, the account's other users of the shared budgets, and how often takeovers, host losses and
reshards happen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from copier.core.capacitylines import (
    FLAG_SHARE,
    GIB,
    HOUR_S,
    ITEM_OVERHEAD_BYTES,
    READ_UNIT_BYTES,
    STREAMS,
    Budget,
    HostLoss,
    Line,
    budgets,
    cost_lines,
    host_loss,
    window_read_s,
)
from copier.core.config import DEFAULTS
from copier.core.errors import PlanError
from copier.core.identity import DIGEST_SIZE
from copier.core.limits import WRITE_BYTES_PER_SHARD_S, WRITE_RECORDS_PER_SHARD_S

__all__ = [
    "FLAG_SHARE",
    "UNKNOWNS",
    "Budget",
    "Line",
    "Measured",
    "Plan",
    "Settings",
    "Workload",
    "chunk_events",
    "default_shards",
    "per_chunk",
    "plan",
    "settings_from",
]


UNKNOWNS = (
    "the KCL daemon's (Java) CPU per event: measured only with the whole host, at a few events a second a shard "
    "(docs/benchmarks.json host[].steady_rate and steady_cpu_us_per_event), so hosts are sized on the processors' "
    "measured CPU and the idle host's, and the utilization target is the margin for the rest",
    "how the benchmark machine's cores (docs/benchmarks.json method.machine) compare with an instance's vCPUs",
    "the account's other users of the per-account and per-stream budgets (the KCL's own DescribeStreamSummary "
    "and ListShards calls, other applications): the flag at half a budget leaves them the other half",
    "how often takeovers, host losses and reshards happen, and how often a chunk is in flight when one does: "
    "their cost is given for one (at most), not a day",
    "on-demand list prices only: reserved capacity, savings plans and the free tier are not in the price table",
)


@dataclass(frozen=True)
class Workload:
    """The user's stream and copier's settings that matter to its cost (per all regions together)."""

    events_per_s: float
    record_bytes: int  # data and partition key, as Kinesis counts a record
    duplicate_rate: float = 0.03
    window_hours: float = 1.0
    retention_hours: float = 24.0  # the staging stream's retention: digests are kept past it
    regions: int = 1  # the events are spread evenly; every per-account budget is per region
    retrieval: str = "POLLING"
    instance: str = "auto"  # a name in the price table, or the cheapest fleet among them
    shards: int | None = None  # the staging stream's shards, all regions; default: the fewest within FLAG_SHARE
    utilization: float = 0.6  # the share of a host's CPU and memory the plan fills
    min_hosts: int = 2  # per region: a host loss is a takeover, not an outage

    def check(self) -> None:
        """A workload the plan can be made for, else :class:`PlanError` naming what is wrong."""
        problems = [
            (self.events_per_s > 0, "events a second must be above 0"),
            (self.record_bytes > 0, "the record size must be above 0"),
            (0 <= self.duplicate_rate < 1, "the duplicate rate must be from 0 to below 1"),
            (self.window_hours > 0 and self.retention_hours > 0, "window and retention hours must be above 0"),
            (self.regions >= 1 and self.min_hosts >= 1, "regions and hosts must be at least 1"),
            (self.retrieval in ("POLLING", "FANOUT"), "retrieval must be POLLING or FANOUT"),
            (0 < self.utilization <= 1, "utilization must be above 0 and at most 1"),
            (self.shards is None or self.shards >= self.regions, "at least one shard a region"),
        ]
        for ok, text in problems:
            if not ok:
                raise PlanError(f"copier plan: {text}")


@dataclass(frozen=True)
class Settings:
    """The settings the call rates follow from: the properties file's, else the code's and the KCL's defaults."""

    idle_s: float  # idleTimeBetweenReadsInMillis
    max_records: int  # maxRecords
    failover_s: float  # failoverTimeMillis: the KCL renews a lease every third of it
    assignment_s: float  # leaseAssignmentIntervalMillis: the leader scans the lease table
    metrics_s: float  # workerMetricsReporterFreqInMillis: each worker writes its row
    checkpoint_s: float  # copier.checkpointIntervalMillis
    coalesce_events: int  # copier.coalesceEvents
    coalesce_s: float  # copier.coalesceMillis
    window_max_events: int  # copier.dedupWindowMaxEvents
    digest_ttl_hours: float  # copier.digestTtlHours
    verify_span_s: float  # a verification read's span: copier's lease, the put timeout, twice the clock margin


@dataclass(frozen=True)
class Measured:
    """The figures ``make bench`` measured, read from docs/benchmarks.json's dict (never typed here)."""

    raw: Mapping[str, Any]

    def cpu_us(self, payload: int, chunk: float, coalesce_events: int) -> tuple[float, float, list[tuple[str, float]]]:
        """The processor's CPU an event (copier's, the plain copier's) for records of ``payload`` bytes in
        chunks of ``chunk``, and the measured cells used: the smallest measured payload at least as large
        (else the largest), between the measured batches around ``chunk`` (:func:`per_chunk`). A delivery
        under ``coalesce_events`` is committed alone (the next one comes a poll later than coalescing waits):
        its cell is the one measured with coalescing off."""
        rows = list(self.raw["cpu"])
        sizes = sorted({r["payload_bytes"] for r in rows})
        size = next((s for s in sizes if s >= payload), sizes[-1])
        cells = {r["batch"]: r for r in rows if r["payload_bytes"] == size}

        def key(row: Mapping[str, Any]) -> str:
            alone = row["batch"] < coalesce_events and row.get("uncoalesced_us_per_event") is not None
            return "uncoalesced_us_per_event" if alone else "copier_us_per_event"

        copier, used = per_chunk({b: float(r[key(r)]) for b, r in cells.items()}, chunk)
        plain, _ = per_chunk({b: float(r["plain_us_per_event"]) for b, r in cells.items()}, chunk)
        figures = []
        for b in used:
            name = f"cpu[payload_bytes={size}, batch={b}]"
            figures += [(f"{name}.{key(cells[b])}", float(cells[b][key(cells[b])]))]
            figures += [(f"{name}.plain_us_per_event", float(cells[b]["plain_us_per_event"]))]
        return copier, plain, figures

    def units_per_event(self, chunk: float) -> tuple[float, list[tuple[str, float]]]:
        """State table write units a forwarded event in chunks of ``chunk`` (:func:`per_chunk` over
        docs/benchmarks.json cost.copier_units_per_million), and the measured cells used."""
        table = {int(k): float(v) for k, v in self.raw["cost"]["copier_units_per_million"].items()}
        units, used = per_chunk(table, chunk)
        return units / 1e6, [(f"cost.copier_units_per_million[{b}]", table[b]) for b in used]

    def bytes_per_id(self) -> float:
        """The window's memory per event ID: the largest measured (docs/benchmarks.json window[].bytes_per_id)."""
        return max(float(r["bytes_per_id"]) for r in self.raw["window"])

    def _host_fit(self, value: Callable[[Mapping[str, Any]], float]) -> tuple[float, float]:
        """A line (base, per shard) through ``value`` of the two host rows with the fewest and the most shards."""
        rows = sorted(self.raw["host"], key=lambda r: r["shards"])
        low, high = rows[0], rows[-1]
        slope = (value(high) - value(low)) / (high["shards"] - low["shards"])
        return value(low) - slope * low["shards"], slope

    def daemon_mb(self) -> tuple[float, float]:
        """The KCL daemon's memory (PSS, MB): a base and MB a shard (docs/benchmarks.json host[].daemon.pss_mb)."""
        return self._host_fit(lambda r: float(r["daemon"]["pss_mb"]))

    def idle_cores(self) -> tuple[float, float]:
        """The idle host's CPU in cores: a base and cores a shard (docs/benchmarks.json host[].idle_cpu_percent)."""
        base, slope = self._host_fit(lambda r: float(r["idle_cpu_percent"]))
        return base / 100, slope / 100

    def processor_mb(self) -> float:
        """An idle processor's memory (PSS, MB), measured in the host with the most shards."""
        return float(max(self.raw["host"], key=lambda r: r["shards"])["processor_pss_mb"])


@dataclass(frozen=True)
class Plan:
    """The plan for one workload: per region unless a name says otherwise."""

    workload: Workload
    shards: int
    events_per_shard_s: float
    chunk_events: float
    instance: str
    hosts: int
    shards_per_host: int
    host_memory_gib: float
    host_cpu_cores: float
    instance_memory_gib: float
    instance_vcpus: int
    copier_us_per_event: float
    plain_us_per_event: float
    state_storage_gib: float
    takeover_read_units: float  # a shard's window loaded once
    host_loss: HostLoss | None = None  # what verifying a lost host's chunks in flight reads of the target
    lines: list[Line] = field(default_factory=list)  # all regions
    budgets: list[Budget] = field(default_factory=list)
    figures: list[tuple[str, float]] = field(default_factory=list)  # (benchmarks.json field, value) used

    @property
    def usd_day(self) -> float:
        return sum(line.usd_day for line in self.lines)

    @property
    def own_usd_day(self) -> float:
        return sum(line.usd_day for line in self.lines if line.own)

    @property
    def kinesis_usd_day(self) -> float:
        return sum(line.usd_day for line in self.lines if not line.own)

    @property
    def start_summary_calls(self) -> int:
        """DescribeStreamSummary calls a fleet start makes at once: one per stream, by the first host's checks
        (``check-config --shared`` and ``copier run`` take the application's answer while it is at most 30 s
        old, and a host that finds another asking waits for its answer); a takeover on a running host asks
        nothing."""
        return STREAMS

    @property
    def start_window_read_s(self) -> float:
        """Seconds a fleet start's (or a mass takeover's) window loads take of the state table's reads."""
        return window_read_s(self.takeover_read_units, self.shards)

    def first_bound(self) -> Budget:
        """The budget the workload uses the most of: the limit that binds first as it grows."""
        return max(self.budgets, key=lambda b: b.share)


def per_chunk(measured: Mapping[int, float], chunk: float) -> tuple[float, list[int]]:
    """A per-event cost measured at a few batch sizes, at ``chunk`` events a chunk: linear in 1/batch between
    the two measured batches around it, a cost a chunk spread over its events plus a cost an event (the shape
    the measured tables have: write units are about two a chunk and 10 bytes an event). Past the largest
    measured batch, the largest's; below the smallest, the line through the two smallest, which grows as
    chunks shrink. Returns the cost and the batches used."""
    batches = sorted(measured)
    if len(batches) == 1 or chunk >= batches[-1]:
        return measured[batches[-1]], [batches[-1]]
    above = next(i for i, b in enumerate(batches) if b > chunk)
    low, high = batches[max(0, above - 1)], batches[max(1, above)]
    share = (1 / chunk - 1 / high) / (1 / low - 1 / high)
    return measured[high] + share * (measured[low] - measured[high]), [low, high]


def settings_from(values: Mapping[str, str]) -> Settings:
    """The settings from a properties file's values: copier's keys default to the code's
    (``copier.core.config.DEFAULTS``), the KCL's to the KCL's own defaults."""

    def ms(key: str, default: float) -> float:
        return float(values.get(key, default)) / 1000

    failover = ms("failoverTimeMillis", 10_000)
    copier = {**DEFAULTS, **values}
    return Settings(
        idle_s=ms("idleTimeBetweenReadsInMillis", 1000),
        max_records=int(values.get("maxRecords", 10_000)),
        failover_s=failover,
        assignment_s=ms("leaseAssignmentIntervalMillis", 2000 * failover),
        metrics_s=ms("workerMetricsReporterFreqInMillis", 30_000),
        checkpoint_s=float(str(copier["copier.checkpointIntervalMillis"])) / 1000,
        coalesce_events=int(str(copier["copier.coalesceEvents"])),
        coalesce_s=float(str(copier["copier.coalesceMillis"])) / 1000,
        window_max_events=int(str(copier["copier.dedupWindowMaxEvents"])),
        digest_ttl_hours=float(str(copier["copier.digestTtlHours"])),
        verify_span_s=(
            float(str(copier["copier.leaseMillis"]) or failover * 1000)
            + float(str(copier["copier.putTimeoutMillis"]))
            + 2 * float(str(copier["copier.clockSkewMillis"]))
        )
        / 1000,
    )


def default_shards(w: Workload) -> int:
    """The fewest staging shards (all regions) that keep producers' writes within FLAG_SHARE of a shard's."""
    per_region = w.events_per_s / w.regions
    need = max(per_region / WRITE_RECORDS_PER_SHARD_S, per_region * w.record_bytes / WRITE_BYTES_PER_SHARD_S)
    return w.regions * max(1, math.ceil(need / FLAG_SHARE))


def chunk_events(w: Workload, s: Settings, per_shard: float) -> float:
    """Events a chunk holds: under polling a delivery (a second's events, at most maxRecords: deliveries come
    ``idle_s`` apart, longer than coalescing waits); under fan-out what arrives within ``coalesceMillis``, at
    most ``coalesceEvents`` (pushes are not sized by copier)."""
    if w.retrieval == "POLLING":
        return max(1.0, min(float(s.max_records), per_shard * s.idle_s))
    return max(1.0, min(float(s.coalesce_events), per_shard * s.coalesce_s))


def plan(w: Workload, s: Settings, m: Measured, prices: Mapping[str, Any]) -> Plan:
    """The plan at ``w.instance``, or (``auto``) at the instance whose fleet costs least a day."""
    w.check()
    instances: Mapping[str, Any] = prices["instances"]
    if w.instance != "auto":
        if w.instance not in instances:
            raise PlanError(f"copier plan: instance {w.instance} is not in the price table ({', '.join(instances)})")
        return _plan_at(w, s, m, prices)
    fits = []
    for name in sorted(instances):
        try:
            fits.append(_plan_at(replace(w, instance=name), s, m, prices))
        except PlanError:
            continue
    if not fits:
        raise PlanError("copier plan: no instance in the price table holds one shard")
    return min(fits, key=lambda p: (p.hosts * instances[p.instance]["hour"], p.instance))


def _plan_at(w: Workload, s: Settings, m: Measured, prices: Mapping[str, Any]) -> Plan:
    shards = (w.shards or default_shards(w)) // w.regions
    per_shard = w.events_per_s / w.regions / shards
    forwarded = per_shard * (1 - w.duplicate_rate)
    chunk = chunk_events(w, s, per_shard)
    us, plain_us, cpu_figures = m.cpu_us(w.record_bytes, chunk, s.coalesce_events)
    window_ids = min(forwarded * w.window_hours * HOUR_S, float(s.window_max_events))
    shard_mb = m.processor_mb() + m.daemon_mb()[1] + window_ids * m.bytes_per_id() / 1e6
    shard_cores = m.idle_cores()[1] + per_shard * us / 1e6
    spec = prices["instances"][w.instance]
    mem_room = spec["memory_gib"] * GIB / 1e6 * w.utilization - m.daemon_mb()[0]
    cpu_room = spec["vcpus"] * w.utilization - m.idle_cores()[0]
    most = math.floor(min(mem_room / shard_mb, cpu_room / shard_cores))
    if most < 1:
        raise PlanError(f"copier plan: one shard does not fit a {w.instance} at {w.utilization:.0%}")
    hosts = max(w.min_hosts, math.ceil(shards / most))
    per_host = math.ceil(shards / hosts)
    lifetime_h = max(w.window_hours + w.retention_hours + 1, s.digest_ttl_hours)
    result = Plan(
        workload=w,
        shards=shards,
        events_per_shard_s=per_shard,
        chunk_events=chunk,
        instance=w.instance,
        hosts=hosts,
        shards_per_host=per_host,
        host_memory_gib=(m.daemon_mb()[0] + per_host * shard_mb) * 1e6 / GIB,
        host_cpu_cores=m.idle_cores()[0] + per_host * shard_cores,
        instance_memory_gib=float(spec["memory_gib"]),
        instance_vcpus=int(spec["vcpus"]),
        copier_us_per_event=us,
        plain_us_per_event=plain_us,
        state_storage_gib=shards
        * lifetime_h
        * HOUR_S
        * (forwarded * DIGEST_SIZE + per_shard / chunk * ITEM_OVERHEAD_BYTES)
        / GIB,
        takeover_read_units=window_ids * DIGEST_SIZE / READ_UNIT_BYTES,
        figures=[
            *cpu_figures,
            ("max(window[].bytes_per_id)", m.bytes_per_id()),
            ("host[most shards].processor_pss_mb", m.processor_mb()),
            ("host[].daemon.pss_mb: base MB", m.daemon_mb()[0]),
            ("host[].daemon.pss_mb: MB a shard", m.daemon_mb()[1]),
            ("host[].idle_cpu_percent: base cores", m.idle_cores()[0]),
            ("host[].idle_cpu_percent: cores a shard", m.idle_cores()[1]),
        ],
    )
    units, unit_figures = m.units_per_event(chunk)
    result.figures.extend(unit_figures)
    return replace(
        result,
        lines=cost_lines(result, s, units, prices),
        budgets=budgets(result, s, units),
        host_loss=host_loss(result, s),
    )
