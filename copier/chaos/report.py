"""docs/reliability.md from the results of a chaos run: a summary, then a row a seed."""

from __future__ import annotations

import json
import platform
from collections import Counter
from collections.abc import Sequence

from copier.chaos.result import SeedResult

__all__ = ["METHOD", "PASS", "render"]

# The limits profile: what it enforces, on which calls, and how to run it.
LIMITS = [
    "**The shard-limits profile** (`make chaos PROFILE=limits`, or `python -m copier.chaos --profile limits`;",
    "its report and results go to `docs/reliability-limits.md` and `.json`). No local backend throttles a",
    "shard; in this profile the proxy enforces Kinesis' per-shard limits exactly, with token buckets per",
    "stream and shard that hold one second's allowance (`copier/chaos/limits.py`, pure, its numbers",
    "`copier/core/limits.py`'s): 1,000 records and 1 MiB a second written (a record counts its data and",
    "partition key; one larger than a second's bytes passes on a full bucket and leaves it in debt),",
    "5 GetRecords and 2 MiB a second read, and no read of a shard for 5 s after a GetRecords that returned",
    "10 MiB. A PutRecords entry's shard is found as Kinesis finds it (its `ExplicitHashKey` or the MD5 of its",
    "partition key, in the stream's ListShards hash ranges, `copier/core/shardmap.py`), a GetRecords' from",
    "the iterators the backend handed out (`copier/chaos/throttle.py`). What the limits refuse is answered",
    "as Kinesis answers it: an entry over its shard's write limit fails alone in a 200 answer",
    '(`FailedRecordCount`, per-entry `ProvisionedThroughputExceededException`, "Rate exceeded for shard',
    "...\"), the others land; a GetRecords over its shard's read limit is refused with HTTP 400 and that",
    "error. The limits apply to every Kinesis call through the proxy: the producer's writes to staging (the",
    "producer writes 8 KiB events, 0.8 to 1.3 MiB a second into one staging shard, at and over its limit,",
    "and writes again only the entries refused, as the Spark writer does), and the copier's target and",
    "dead-letter puts and reads (the verification of ambiguous puts). The target has one shard: the copier",
    "forwards each event of a KPL aggregate as a record of its own, and its catch-up after a process fault",
    "meets the target's limits. The KCL's calls go to the backend directly, as in every profile (the proxy",
    "stands between the copier and the backend), and so do the check's reads. The profile opens no fault window",
    "of the proxy's own; it draws one or two process faults and poison records. Counted per stream:",
    "`shard_limit_staging_put_entries_refused`, `shard_limit_target_put_entries_refused`,",
    "`shard_limit_target_reads_refused`. A seed passes by the same rules as any other: everything",
    "caught up, nothing lost, no duplicate unreported, order kept per key (judged in the order records",
    "landed in staging: an entry refused and written again lands after the entries of its put that did not",
    "fail).",
    "",
    "Verification reads share the target's read budget: the copier's read of an ambiguous put's shards, and",
    "`copier verify`, read a shard no faster than its limits allow whoever else reads it, waiting after",
    "each page for its bytes (`copier/core/limits.py`'s `read_pause_s`: 0.2 s, longer for a page of more",
    "than 400 KiB, 5 s after 10 MiB). A read refused all the same (the target's other consumers used the",
    "budget) is retried: the copier's every half second, as long as it takes, renewing its lease meanwhile;",
    "`copier verify`'s with backoff, up to 10 times a call (each after botocore's own retries), while its",
    "progress line goes on counting what was read.",
]

# The faults beyond processes, staging reshards and the proxy's (what they are, why, and how each is counted).
METHOD = [
    "Besides process faults (kills, pauses shorter and longer than the lease, workers joining and leaving),",
    "staging splits and merges and the proxy's AWS faults, a seed may draw four more kinds:",
    "",
    "- **Clocks off AWS time.** Each host's `copier process` children run under libfaketime",
    "  (`copier/chaos/clocks.py`; the daemon's JVM and the local backend, which stands for AWS time, stay on",
    "  the real clock): on time, off by up to half of `copier.clockSkewMillis` (the protocol's assumption),",
    "  or by 3 to 8 times it; and clock steps of 2 to 6 times it, forward and back, while processors run.",
    "  The copier must measure each offset against the `Date` of AWS answers and widen its margins",
    "  (`clock_margin_widened`). Counted: hosts whose workers started off time (`clock_offset_within`,",
    "  `clock_offset_beyond`), steps written while the host's worker ran (`clock_step_forward`,",
    "  `clock_step_back`); each seed's results keep, per host, what was drawn, stepped and measured.",
    "- **Settings changing between owners.** Each worker start, restarts included, runs with a properties",
    "  file of its own, as in a rolling deploy: `copier.dedupKey` `json:eventId` or `json:meta.alt` (the",
    "  producer writes `meta.alt`, `a-` and the event ID as JSON, into every event; the check goes by",
    "  `eventId`) and",
    "  `copier.unkeyedPolicy` `deadletter` or `forward`. Counted: starts whose settings differ from the",
    "  previous start's (`settings_change`).",
    "- **Target reshards.** Splits and merges of the target stream, most of them carried out the moment the",
    "  proxy makes a target put ambiguous (a timeout or a lost answer), so that the copier verifies that put",
    "  across the reshard. Counted: `target_split`, `target_merge`, and `target_reshard_across_ambiguous_put`",
    "  when an ambiguous target put was sent before the reshard and verified after it.",
    "- **Streams that ignore partition keys.** The staging or the target stream switched to",
    "  `RecordDistributionStrategy = AUTO` for 4 to 10 s and back (emulated by the local backend: records go",
    "  round robin over the open shards): the staging stream around the producer's late duplicates (plain",
    "  records: a KPL aggregate put under AUTO would lose its user records at the KCL, so the producer writes",
    "  none while it lasts), which then land on other shards than their originals; the target while the",
    "  copier puts the bulk of the events. Counted: `staging_auto`, `target_auto`, and the records the check",
    "  found on a shard whose hash range does not hold their key (`scattered_staging`, `scattered_target`).",
    "",
    *LIMITS,
    "",
    "**Two backends.** `make chaos` runs the seeds on moto (the default); `make chaos BACKEND=independent`",
    "(`python -m copier.chaos --backend independent`) on kinesis-mock and dynalite, two implementations",
    "copier did not write or patch (`copier/local/independent.py`), into `docs/reliability-independent.md`",
    "and `.json`. There a seed leaves out what kinesis-mock cannot serve (`copier/chaos/schedule.py`,",
    "`on_backend`): records over 1 MiB (no UpdateMaxRecordSize: no `oversize` poison) and",
    "`RecordDistributionStrategy` (no AUTO switch); the proxy forwards each service to its own port, and",
    "the KCL's lease table is created with its index first (dynalite cannot add it). Each seed's result",
    "names its `backend` (results without the field ran on moto).",
]


# What a seed must show to pass (copier/chaos/check.py's module docstring says the same, rule by rule).
PASS = [
    "## What a seed must show to pass",
    "",
    "The check reads both streams to their ends (every shard, closed ones included, a closed one until",
    "GetRecords answers without a NextShardIterator, as AWS marks a closed shard's end, in pages of 500 records",
    "so that shards take several) and compares every copy with the producer's own record of each user record",
    "it wrote: event ID (read from the bytes by the check's own code, not the copier's: the integer `7` and",
    'the string `"7"` are two events, and the producer writes both kinds, unicode and 300-character IDs',
    "too), partition key, SHA-256 of the bytes, staging position, and for a poison record the dead-letter",
    "reason it must get. A seed passes only if:",
    "",
    "- every produced event ID has a copy in the target or in a valid dead-letter envelope (else *lost*);",
    "- every copy counts, target and dead-letter stream together. An extra copy is *explained* only by a",
    "  `possible_duplicates` report that names its ID (under either dedup key a worker ran), one copy per",
    "  report and ID, arriving within the window the report gives; any other extra copy fails the seed. The",
    "  reports, the IDs they name and the copies they excused are counted below;",
    "- every target copy has the partition key and bytes (SHA-256) of a record produced under its ID (a copy",
    "  cut down or rekeyed is *changed* and fails), and no ID in the target was never produced;",
    "- every dead-letter record is an envelope that points at a produced record (shard, sequence and",
    "  sub-sequence number) with its key and bytes (or their SHA-256 when too large to keep) and a reason",
    "  the record bears out and the producer wrote it for (no event ID; too large for the target: the",
    "  staging stream takes records up to 2 MiB, the target 1 MiB). A keyed event there fails the seed;",
    "- each poison record is in the dead-letter stream exactly once and nothing without an ID is in the",
    "  target, unless a worker ran `unkeyedPolicy = forward`: then a record without an ID must be in one of",
    "  the two streams, and a further copy (sent again after an ambiguous put or a crash: identical records",
    "  cannot be told apart) passes only where a `possible_duplicates` report names the record (its content",
    "  digest), one copy per name and report, within the report's window; an oversize record goes to the",
    "  dead-letter stream under any policy;",
    "- per partition key as produced, no event's first copy lands after a later-produced event's; an event",
    "  with a copy on a shard whose hash range does not hold its key (put while that stream was AUTO, when",
    "  Kinesis keeps no order) is left out of this rule and counted (`unordered`), its copies judged as all;",
    "- every shard of both streams was read to its last record; no `fatal` or `unexpected_error` line in the",
    "  copier's logs (read from the daemon's wrapped lines and its raw echo, each event once); no crash loop;",
    "  every shard caught up in time.",
    "",
    "Counts in the report are of what happened: poison records as written, proxy faults as injected (a",
    "window that met no request before the run ended is counted as `proxy_window_idle_<kind>`), the pauses",
    "shorter and longer than the lease drawn around the lease the workers' properties give.",
]


def _later_summary(results: Sequence[SeedResult], total: Counter[str]) -> list[str]:
    """A list on the clock, settings, target-reshard and AUTO faults, and on the copies of events without an ID."""
    beyond = [c for r in results for c in r.clocks if c["kind"] == "beyond"]
    return [
        f"- Clocks: {sum(1 for r in results if r.clocks)} seeds with hosts under libfaketime; hosts off time within "
        f"the margin {total['clock_offset_within']}, beyond it {total['clock_offset_beyond']}; clock steps "
        f"{total['clock_step_forward']} forward, {total['clock_step_back']} back; `clock_margin_widened` logged "
        f"on {sum(1 for c in beyond if c['margin_widened'])} of the {len(beyond)} hosts beyond the margin.",
        f"- Settings: {sum(1 for r in results if len({json.dumps(s['settings']) for s in r.settings}) > 1)} seeds "
        f"whose workers ran different settings, {total['settings_change']} changes between starts; "
        f"{sum(r.verified_across_settings for r in results)} chunks in flight verified under settings other "
        "than their verifier's.",
        f"- Target reshards: {total['target_split'] + total['target_merge']}, "
        f"{total['target_reshard_across_ambiguous_put']} of them across an ambiguous target put; "
        f"{sum(r.target_shards_closed for r in results)} closed target shards read to their end.",
        f"- Streams ignoring keys (AUTO): staging {total['staging_auto']} times, target {total['target_auto']}; "
        f"{sum(r.scattered_staging for r in results)} staging and {sum(r.scattered_target for r in results)} "
        f"target records off their key's shard; {sum(r.unordered for r in results)} events not judged for order.",
        "- The backend's answers to the puts the proxy forwarded: the slowest "
        f"{max((r.slowest_put_ms for r in results), default=0)} ms; "
        f"{sum(r.late_puts for r in results)} later than the seed's put timeout (a put received must be readable "
        "within it: docs/protocol.md, Assumptions; a later one would be the machine breaking the bound).",
        f"- Events without an ID (poison records) delivered more than once under `unkeyedPolicy = forward`: "
        f"{sum(r.unkeyed_copies for r in results)} further copies, {sum(r.unkeyed_explained for r in results)} of "
        "them explained by `possible_duplicates` reports (any other fails its seed).",
    ]


def _faults(faults: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(faults.items())) or "-"


def render(
    results: Sequence[SeedResult],
    command: str,
    elapsed_s: float,
    planned: int | None = None,
    code: str = "",
    raw: str = "docs/reliability.json",
) -> str:
    """The Markdown report (of the seeds run so far, when fewer than ``planned``); ``code``: the code digest;
    ``raw``: where the raw results are."""
    total: Counter[str] = Counter()
    for r in results:
        total.update(r.faults)
    failed = [r for r in results if not r.ok]
    lines = [
        "# Reliability: the fault-injection suite",
        "",
        "Each seed runs the real pipeline (local backend, `copier run` workers with the KCL MultiLangDaemon,",
        "a producer of plain and KPL-aggregated records with duplicates and poison records) under the faults",
        "its seed draws, then checks the target and dead-letter streams against what was produced.",
        "What each fault is: `copier/chaos/schedule.py` and `copier/chaos/proxy.py`; the check:",
        "`copier/chaos/check.py`.",
        "",
        *METHOD,
        "",
        *PASS,
        "",
        f"Command: `{command}` ({elapsed_s / 60:.0f} minutes on {platform.machine()}, "
        f"{platform.python_implementation()} {platform.python_version()}). Raw results: `{raw}`.",
        *(
            [f"Code digest `{code}` (the copier package and setup.cfg's pins; `copier/chaos/__main__.py`).", ""]
            if code
            else []
        ),
        "",
        "## Summary",
        "",
        *(
            [f"**In progress or interrupted: {len(results)} of {planned} seeds ran.**", ""]
            if planned is not None and len(results) < planned
            else []
        ),
        "| seeds | failed | events | events written | lost | duplicated IDs | extra copies | explained copies | "
        "reports (IDs named) | changed | out of order |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {len(results)} | {len(failed)} | {sum(r.events for r in results)} | "
        f"{sum(r.events_written for r in results)} | {sum(r.lost for r in results)} | "
        f"{sum(r.duplicated for r in results)} | {sum(r.extra_copies for r in results)} | "
        f"{sum(r.explained_duplicates for r in results)} | {sum(r.possible_duplicate_reports for r in results)} "
        f"({sum(r.reported_ids for r in results)}) | {sum(r.changed for r in results)} | "
        f"{sum(r.out_of_order for r in results)} |",
        "",
        f"Backend: {', '.join(f'{b} {n} seeds' for b, n in sorted(Counter(r.backend for r in results).items()))}. "
        f"KCL 3.x mode: {sum(1 for r in results if r.kcl_mode == '3.x')} seeds; "
        f"2.x-compatible mode: {sum(1 for r in results if r.kcl_mode == '2.x')} seeds. "
        f"Worker restarts: {sum(r.restarts for r in results)}; "
        f"unexpected daemon exits: {sum(r.unexpected_exits for r in results)}.",
        "",
        *_later_summary(results, total),
        "",
        "Faults injected, by kind:",
        "",
        "| fault | count |",
        "|---|---|",
        *(f"| {kind} | {count} |" for kind, count in sorted(total.items())),
        "",
        "## Seeds",
        "",
        "| seed | mode | workers | events | staging records | aggregates (largest) | lost | duplicated | "
        "out of order | caught up (s) | time (s) | faults | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        verdict = "ok" if r.ok else "FAILED: " + "; ".join(r.failures)
        lines.append(
            f"| {r.seed} | {r.kcl_mode} | {r.workers} | {r.events} | {r.staging_records} | "
            f"{r.aggregates} ({r.largest_aggregate}) | {r.lost} | {r.duplicated} | {r.out_of_order} | "
            f"{r.caught_up_s if r.caught_up_s is not None else '-'} | {r.total_s} | {_faults(r.faults)} | {verdict} |"
        )
    return "\n".join(lines) + "\n"
