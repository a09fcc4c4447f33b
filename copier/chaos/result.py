"""SeedResult: what one chaos seed did and found, JSON-ready.

One result is one row of docs/reliability.md (``copier.chaos.report``); the
JSON report keeps them so that ``--resume`` can read them back. It holds no
logic of the run: :mod:`copier.chaos.run` fills it from the harness and the
check.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["SeedResult"]


@dataclass
class SeedResult:
    """What a seed did and found: JSON-ready, one row of docs/reliability.md."""

    seed: int
    profile: str
    kcl_mode: str
    workers: int
    ok: bool = False
    backend: str = "moto"  # copier local-backend --impl it ran on (results written before it existed: moto)
    failures: list[str] = field(default_factory=list)
    events: int = 0  # distinct keyed events produced
    events_written: int = 0  # events written to staging, duplicates included
    staging_records: int = 0
    aggregates: int = 0
    largest_aggregate: int = 0
    producer_duplicates: int = 0
    target_records: int = 0
    dead_letter_records: int = 0
    lost: int = 0
    duplicated: int = 0
    explained_duplicates: int = 0  # extra copies a possible_duplicates report excused (one per report and ID)
    extra_copies: int = 0  # copies beyond the first, explained or not
    changed: int = 0  # target copies whose key or bytes differ from what was produced
    possible_duplicate_reports: int = 0
    reported_ids: int = 0  # IDs the reports name, each report counted
    check_pages: int = 0  # GetRecords pages the check read (several per shard: the multi-page path)
    out_of_order: int = 0
    unordered: int = 0  # events not judged for order: a copy lay on a shard not holding its key (AUTO)
    scattered_staging: int = 0  # produced records on a staging shard not holding their key
    scattered_target: int = 0  # target records on a shard not holding their key
    poison: int = 0
    unkeyed_copies: int = 0  # copies beyond the first of poison records without an ID (unkeyedPolicy = forward)
    unkeyed_explained: int = 0  # of those, copies a possible_duplicates report excused (one per name and report)
    target_shards: int = 0  # target shards read by the check, closed ones included
    target_shards_closed: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    clock_skew_ms: int = 0  # copier.clockSkewMillis of every worker
    clocks: list[dict[str, Any]] = field(default_factory=list)  # per faked host: drawn, stepped, measured
    settings: list[dict[str, Any]] = field(default_factory=list)  # per worker start: its settings and host
    verified_across_settings: int = 0  # verified_pending lines whose batch was recorded under other settings
    target_reshards: list[dict[str, Any]] = field(default_factory=list)
    auto_switches: list[dict[str, Any]] = field(default_factory=list)  # stream, from and until (s), done
    ambiguous_puts: list[dict[str, Any]] = field(default_factory=list)  # when the proxy made a put ambiguous, where
    proxy_requests: dict[str, int] = field(default_factory=dict)  # the copier's calls through the proxy, by class
    slowest_put_ms: int = 0  # the backend's longest answer to a PutRecords the proxy forwarded
    late_puts: int = 0  # PutRecords the backend answered after the put timeout: the protocol's bound broken locally
    unexpected_exits: int = 0
    restarts: int = 0
    startup_s: float = 0.0  # until every staging shard had a processor; the plan's clock starts then
    caught_up_s: float | None = None  # after the producer finished and the last action ran
    total_s: float = 0.0
    workdir: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SeedResult:
        """A result read back from the JSON report (``--resume``); keys it does not know are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})
