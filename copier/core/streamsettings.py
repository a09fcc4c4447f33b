"""The stream settings copier relies on, read from DescribeStreamSummary, and what copier does under each.

Kinesis moved under copier: a stream's record limit can be raised to 10 MiB
(``UpdateMaxRecordSize``), and an on-demand stream can be switched at any time
to ``RecordDistributionStrategy = AUTO``, under which Kinesis ignores partition
keys and spreads records over every shard. Pure values and rules, no I/O:
``copier.adapters.kinesis`` reads the summaries, ``copier.shard`` and ``copier check-config``
act on the verdicts.

What copier does, per stream and strategy (docs/protocol.md, "Stream settings"):

* **staging AUTO**: a producer's copies of an event land on different shards,
  and each shard's processor would forward its copy; KPL aggregates land on
  shards whose hash range their user records are not in, and the KCL drops
  those. Copier refuses it: a processor that sees it stops forwarding (holding
  its lease, asking DescribeStreamSummary again at most every ``SUMMARY_RETRY_S``) with an error that
  names the setting, and reports as possible duplicates what it forwarded since
  it last saw ``USER_PARTITION_KEY``.
* **target AUTO**: an entry can land on any open shard. Verifying an ambiguous
  put reads the shards its keys hash to first and, when something is missing,
  every other shard of the map taken before the put (with their children)
  before sending anything again: correct whatever the strategy, and paid only
  on that path. Kinesis keeps no per-key order under AUTO, so
  ``copier.ordering = partitionKey`` stops forwarding with an error that says
  so; with ``ordering = none`` nothing changes.
* **record limits**: a record the target's limit cannot take goes to the
  dead-letter stream (or stalls the shard without one); an envelope over the
  dead-letter stream's own limit keeps the payload's SHA-256 instead of it.
  A limit copier cannot read (DescribeStreamSummary throttled or denied, and
  no earlier answer) is never guessed: :func:`planned_limit` plans under the
  most any stream takes, the put is tried and the stream decides; one it
  refuses is re-planned once the limit can be read (``copier.core.replan``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from copier.core.limits import MAX_RECORD_BYTES, MAX_STREAM_RECORD_BYTES

__all__ = [
    "open_shards",
    "AUTO",
    "PARTITION_KEY",
    "SUMMARY_MAX_AGE_S",
    "SUMMARY_RETRY_S",
    "refused_limit",
    "StreamSettings",
    "Verdict",
    "blocking",
    "judge",
    "planned_limit",
]

# How old a stream's settings may be when copier acts on them. DescribeStreamSummary allows 20 calls a second per
# account, shared by every host and every other user of the account: a forwarding processor asks every 5 minutes
# (a switch is seen within that, or at once from the records for staging AUTO); one that is blocked by a
# setting, or whose records suggest a switch, or whose last call failed, asks again after 30 s.
SUMMARY_MAX_AGE_S = 300.0
SUMMARY_RETRY_S = 30.0

PARTITION_KEY = "USER_PARTITION_KEY"  # the API's name for keys deciding the shard
AUTO = "AUTO"
HOUR_MS = 3_600_000


@dataclass(frozen=True)
class StreamSettings:
    """One stream's settings as DescribeStreamSummary gives them (absent fields: Kinesis' defaults)."""

    name: str
    retention_ms: int | None = None
    max_record_bytes: int = MAX_RECORD_BYTES
    distribution: str = PARTITION_KEY
    encryption: str = "NONE"
    key_id: str | None = None
    mode: str = "PROVISIONED"
    open_shards: int | None = None

    @classmethod
    def from_summary(cls, name: str, summary: dict[str, Any]) -> StreamSettings:
        """From a ``StreamDescriptionSummary``; a field the answer lacks (an older API) is Kinesis' default."""
        hours = summary.get("RetentionPeriodHours")
        kib = summary.get("MaxRecordSizeInKiB")
        mode = (summary.get("StreamModeDetails") or {}).get("StreamMode") or "PROVISIONED"
        return cls(
            name=name,
            retention_ms=int(hours) * HOUR_MS if hours else None,
            max_record_bytes=int(kib) * 1024 if kib else MAX_RECORD_BYTES,
            distribution=str(summary.get("RecordDistributionStrategy") or PARTITION_KEY),
            encryption=str(summary.get("EncryptionType") or "NONE"),
            key_id=summary.get("KeyId"),
            mode=str(mode),
            open_shards=summary.get("OpenShardCount"),
        )

    @property
    def auto(self) -> bool:
        return self.distribution == AUTO


@dataclass(frozen=True)
class Verdict:
    """One line of ``check-config``'s stream report: ``level`` ok, warning or error (error: copier will not
    forward as configured)."""

    stream: str
    level: str
    text: str


def blocking(staging: StreamSettings | None, target: StreamSettings | None, ordering: str) -> str | None:
    """Why copier must not forward now (None: it may). Settings that cannot be read do not block: the
    records themselves still show a staging stream that ignores keys (``copier.shard``)."""
    if staging is not None and staging.auto:
        return (
            f"the staging stream {staging.name} has RecordDistributionStrategy AUTO: Kinesis ignores partition "
            "keys, so a producer's copies of an event land on different shards, where no shard's dedup window "
            "sees the others. Forwarding stops until it is USER_PARTITION_KEY again "
            "(UpdateStreamRecordDistributionStrategy); records written meanwhile are reported as possible "
            "duplicates when forwarded"
        )
    if target is not None and target.auto and ordering == "partitionKey":
        return (
            f"the target stream {target.name} has RecordDistributionStrategy AUTO, under which Kinesis keeps no "
            "order per partition key, and copier.ordering = partitionKey promises it. Forwarding stops until the "
            "target is USER_PARTITION_KEY again, or copier.ordering = none"
        )
    return None


def planned_limit(settings: StreamSettings | None) -> int:
    """The record limit a chunk is planned under for a stream: its own, as DescribeStreamSummary last gave it;
    unknown (never read), the most any stream takes (``UpdateMaxRecordSize``'s 10 MiB), never the 1 MiB
    default. A guess would dead-letter a record the stream may take (its limit raised); the put decides
    instead: a record over the real limit is refused whole (``ValidationException``) and re-planned under
    the limit the refusal names when the limit cannot be read now (``refused_limit``), never waiting on
    DescribeStreamSummary (``copier.shard.pipeline.Replanner``)."""
    return settings.max_record_bytes if settings is not None else MAX_STREAM_RECORD_BYTES


# AWS's words for a record over the limit (the data member of entry N; the request's own 500-entry limit is said
# of 'records', not of a member's data, and is not a record limit).
_REFUSED_LIMIT = re.compile(
    r"'records\.\d+\.member\.data' failed to satisfy constraint: Member must have length less than or equal to (\d+)"
)


def refused_limit(code: str, message: str) -> int | None:
    """The record limit a PutRecords refused whole for a record's size names (``ValidationException``: "Value at
    'records.N.member.data' failed to satisfy constraint: Member must have length less than or equal to
    1048576"), or None. The refusal is the stream's own word on its limit now: a chunk planned under a limit
    copier could not read (DescribeStreamSummary throttled or denied, :func:`planned_limit`) is re-planned under
    it without waiting for that call."""
    if code not in ("ValidationException", "InvalidArgumentException"):  # the two a record's size is refused with
        return None
    found = _REFUSED_LIMIT.search(message)
    return int(found.group(1)) if found else None


def _mib(size: int) -> str:
    return f"{size / 1024 / 1024:g} MiB"


def open_shards(count: int | None, unknown: str = "?") -> str:
    """``1 open shard``, ``4 open shards``; ``unknown`` in place of a count not known (None)."""
    if count is None:
        return f"{unknown} open shards"
    return f"{count} open shard{'' if count == 1 else 's'}"


def judge(
    staging: StreamSettings,
    target: StreamSettings,
    dead_letter: StreamSettings | None,
    *,
    ordering: str,
    window_ms: int,
    digest_ttl_floor_ms: int,
) -> list[Verdict]:
    """What copier makes of the three streams' settings: a line each of what it found, and a verdict."""
    out: list[Verdict] = []
    for role, s in (("staging", staging), ("target", target), ("dead-letter", dead_letter)):
        if s is None:
            continue
        retention = f"{s.retention_ms // HOUR_MS} h" if s.retention_ms else "unknown"
        key = f" ({s.key_id})" if s.key_id else ""
        out.append(
            Verdict(
                s.name,
                "ok",
                f"{role} {s.name}: {s.mode}, {open_shards(s.open_shards)}, "
                f"RecordDistributionStrategy {s.distribution}, MaxRecordSize {_mib(s.max_record_bytes)}, "
                f"retention {retention}, encryption {s.encryption}{key}",
            )
        )
    if staging.auto:
        out.append(
            Verdict(
                staging.name,
                "error",
                f"staging {staging.name} has RecordDistributionStrategy AUTO: Kinesis ignores partition keys, so a "
                "producer's copies of an event land on different shards and KPL aggregates on shards the KCL drops "
                "them from; copier stops forwarding while it is AUTO. Set it back with "
                "UpdateStreamRecordDistributionStrategy (USER_PARTITION_KEY)",
            )
        )
    if target.auto:
        if ordering == "partitionKey":
            out.append(
                Verdict(
                    target.name,
                    "error",
                    f"target {target.name} has RecordDistributionStrategy AUTO, under which Kinesis keeps no order "
                    "per partition key, and copier.ordering = partitionKey: copier stops forwarding while both hold. "
                    "Set copier.ordering = none, or the target back to USER_PARTITION_KEY",
                )
            )
        else:
            shards = open_shards(target.open_shards, unknown="every")
            out.append(
                Verdict(
                    target.name,
                    "warning",
                    f"target {target.name} has RecordDistributionStrategy AUTO: verifying an ambiguous put reads "
                    f"{shards} of it, not only the ones its keys hash to",
                )
            )
    if target.max_record_bytes < staging.max_record_bytes:
        where = (
            "go to the dead-letter stream" if dead_letter is not None else "stall their shard (no dead-letter stream)"
        )
        out.append(
            Verdict(
                target.name,
                "warning" if dead_letter is not None else "error",
                f"target {target.name} takes records up to {_mib(target.max_record_bytes)}, staging up to "
                f"{_mib(staging.max_record_bytes)}: records over {target.max_record_bytes} bytes (key included) "
                f"{where}",
            )
        )
    if dead_letter is not None and dead_letter.max_record_bytes < staging.max_record_bytes * 4 // 3 + 1024:
        out.append(
            Verdict(
                dead_letter.name,
                "ok",
                f"dead-letter {dead_letter.name} takes records up to {_mib(dead_letter.max_record_bytes)}: an "
                "envelope of a larger staging record (its bytes in base64) keeps their SHA-256 instead of them (the "
                "record stays readable in staging within its retention)",
            )
        )
    if dead_letter is not None and dead_letter.retention_ms and staging.retention_ms:
        if dead_letter.retention_ms < staging.retention_ms:
            out.append(
                Verdict(
                    dead_letter.name,
                    "warning",
                    f"dead-letter {dead_letter.name} keeps records {dead_letter.retention_ms // HOUR_MS} h, staging "
                    f"{staging.retention_ms // HOUR_MS} h: a dead-lettered event can be sent on (copier redrive) only "
                    "while the dead-letter stream keeps it, so events dead-lettered during an outage shorter than "
                    "staging's retention can be lost for good. Raise its retention (IncreaseStreamRetentionPeriod) "
                    "to at least staging's",
                )
            )
    if staging.retention_ms:
        ttl = max(digest_ttl_floor_ms, window_ms + staging.retention_ms + HOUR_MS)
        out.append(
            Verdict(
                staging.name,
                "ok",
                f"digest batches live up to {ttl // HOUR_MS} h (newest arrival + dedup window + staging retention "
                "+ 1 h, at least copier.digestTtlHours)",
            )
        )
    if target.retention_ms:
        out.append(
            Verdict(
                target.name,
                "ok",
                f"a chunk in flight is verified exactly after an owner gap of up to {target.retention_ms // HOUR_MS} h "
                "(the target's retention); after a longer one what is not found is sent again and reported as "
                "possible duplicates",
            )
        )
    return out
