"""The ``copier verify`` report: the audit's verdict with what it was run on, as text or as JSON.

``copier verify`` prints exactly one report on stdout, the text one for
people (counts, examples of each problem, the verdict on its last line) or,
with ``--json``, one JSON object for scripts and alerting. ``copier audit``
(``copier.spark.audit``) prints the same report for the same streams.
Pure: no I/O, rendering only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from copier.core.audittypes import AuditReport, show
from copier.core.identity import EventValue

__all__ = ["VerifyResult", "render_json", "render_text"]


@dataclass(frozen=True)
class VerifyResult:
    """The audit and what it was run on, for the report."""

    report: AuditReport
    source: str  # "staging" or "manifest"
    source_records: int  # staging records read, or non-blank manifest lines
    source_unkeyed: int  # staged events without an event ID (never expected in the target)
    target_stream: str
    dead_letter_stream: str | None
    source_events: int = 0  # staged events once aggregates are de-aggregated
    source_aggregates: int = 0  # staging records that are KPL aggregates
    undecodable: int = 0  # records that start like an aggregate but cannot be decoded
    undecodable_examples: tuple[str, ...] = ()  # shard@sequence number
    dropped: int = 0  # aggregates the daemon drops or truncates (hash key out of range, bad index)
    dropped_examples: tuple[str, ...] = ()
    before_start: int = 0  # staged events before the application's start (its first copy's arrival): not owed
    # Why the copier's committed positions were not read (then every missing event counts as lost); None: read.
    positions_unknown: str | None = None

    @property
    def ok(self) -> bool:
        """Nothing lost, nothing duplicated, and nothing in staging that could not be counted (events still to
        be copied are not a failure: see ``complete``)."""
        return self.report.ok and self.undecodable == 0

    @property
    def complete(self) -> bool:
        """``ok``, and every event copied."""
        return self.ok and self.report.complete


def _ids(ids: Iterable[EventValue]) -> str:
    return ", ".join(show(i) for i in ids)


def _example_lines(r: AuditReport) -> list[str]:
    lines: list[str] = []
    if r.lost_examples:
        lines.append("  lost: " + _ids(r.lost_examples))
    if r.pending_examples:
        lines.append("  pending: " + _ids(r.pending_examples))
    if r.duplicated_examples:
        copies = ", ".join(f"{show(i)} x{n}" for i, n in r.duplicated_examples)
        lines.append(f"  duplicated ({r.extra_copies} extra copies, {r.explained_copies} reported): {copies}")
    if r.unexplained_examples:
        lines.append("  unexplained copies of: " + _ids(r.unexplained_examples))
    if r.changed_examples:
        lines.append("  changed (key or bytes not as produced): " + ", ".join(r.changed_examples))
    if r.unexpected_examples:
        lines.append("  unexpected: " + _ids(r.unexpected_examples))
    if r.unkeyed_examples:
        where = ", ".join(
            f"{u.shard_id}@{u.sequence_number} (partition key {u.partition_key})" for u in r.unkeyed_examples
        )
        lines.append("  without an event ID in the target: " + where)
    if r.unkeyed_lost_examples:
        lines.append("  lost without an event ID (staging position): " + ", ".join(r.unkeyed_lost_examples))
    if r.unkeyed_unexplained_examples:
        lines.append(
            "  unexplained copies without an event ID (where each is): " + ", ".join(r.unkeyed_unexplained_examples)
        )
    if r.out_of_order_examples:
        wrong = ", ".join(
            f"{show(o.event_id)} after {show(o.after)} (partition key {o.partition_key})"
            for o in r.out_of_order_examples
        )
        lines.append("  out of order: " + wrong)
    if r.dead_lettered_examples:
        lines.append(f"  dead-lettered ({r.dead_lettered}, delivered there): " + _ids(r.dead_lettered_examples))
    if r.invalid_dead_letter_examples:
        lines.append("  invalid dead-letter records: " + "; ".join(r.invalid_dead_letter_examples))
    return lines


def _source_line(result: VerifyResult) -> str:
    r = result.report
    if result.source != "staging":
        return f"verify: produced {r.expected} distinct events ({result.source_records} manifest lines)"
    parts = [f"{result.source_records} records in staging"]
    if result.source_aggregates:
        parts.append(f"{result.source_aggregates} of them KPL aggregates, {result.source_events} events in all")
    if result.source_unkeyed:
        parts.append(f"{result.source_unkeyed} events without an event ID")
    return f"verify: produced {r.expected} distinct events ({', '.join(parts)})"


def render_text(result: VerifyResult) -> str:
    """The human report: counts, examples of each problem, and the verdict."""
    r = result.report
    dead_letter = f"{r.dead_letter_records} records" if result.dead_letter_stream else "none configured"
    if r.redriven:
        dead_letter += f" ({r.redriven} sent on by copier redrive: the target's copy counts)"
    lines = [
        _source_line(result),
        f"target: {r.found} records; dead-letter: {dead_letter}",
        f"lost: {r.lost}, pending: {r.pending} (in staging after the copier's committed position), "
        f"duplicated: {r.duplicated} ({r.unexplained_copies} unexplained copies), "
        f"changed: {r.changed}, unexpected: {r.unexpected}, out of order (per partition key): {r.out_of_order}",
        f"without an event ID: {r.unkeyed_expected} produced, {r.unkeyed_lost} lost, {r.unkeyed_pending} pending, "
        f"{r.unkeyed_extra_copies} extra copies ({r.unkeyed_unexplained} unexplained); in the target without an ID: "
        f"{r.unkeyed} ({r.unkeyed_unexpected} never produced)",
        f"dead-letter stream: {r.dead_lettered} events delivered there, {r.invalid_dead_letters} invalid records; "
        f"possible_duplicates reports: {r.reports} naming {r.reported_ids} IDs and {r.reported_unkeyed} records "
        "without an ID",
        *_example_lines(r),
    ]
    if result.undecodable:
        lines.append(
            f"undecodable KPL aggregates in staging: {result.undecodable} (the events inside cannot be counted): "
            + ", ".join(result.undecodable_examples)
        )
    if result.before_start:
        lines.append(f"staged events before the application's start (never copied, not counted): {result.before_start}")
    if result.dropped:
        lines.append(
            f"KPL aggregates the daemon drops whole or in part (a user record's hash key outside its shard, "
            f"or a bad key index): {result.dropped}: " + ", ".join(result.dropped_examples)
        )
    if result.positions_unknown is not None and (r.lost or r.unkeyed_lost):
        lines.append(
            f"the copier's committed positions could not be read ({result.positions_unknown}): "
            "every missing event counts as lost, even one the copier has not reached yet"
        )
    if result.complete:
        lines.append("verify: OK")
    elif result.ok:
        waiting = r.pending + r.unkeyed_pending
        lines.append(
            f"verify: PENDING ({waiting} events not copied yet: in staging after the copier's committed "
            "position; nothing lost or duplicated so far; run it again once the copier has caught up)"
        )
    else:
        problems = [
            f"{name} {n}"
            for name, n in (
                ("lost", r.lost),
                ("unexplained copies", r.unexplained_copies),
                ("changed", r.changed),
                ("invalid dead letters", r.invalid_dead_letters),
                ("lost without an ID", r.unkeyed_lost),
                ("unexplained copies without an ID", r.unkeyed_unexplained),
                ("undecodable aggregates", result.undecodable),
            )
            if n
        ]
        lines.append(f"verify: FAILED ({', '.join(problems)})")
    # Event IDs and keys are shown as they are, but a lone surrogate (JSON can carry one) has no UTF-8 form and
    # would make printing the report fail: it is shown as its escape, \ud800.
    return "\n".join(lines).encode("utf-8", "backslashreplace").decode("utf-8")


def render_json(result: VerifyResult) -> str:
    """The report as one JSON object, for scripts and alerting."""
    return json.dumps(
        {
            "source": result.source,
            "source_records": result.source_records,
            "source_events": result.source_events,
            "source_aggregates": result.source_aggregates,
            "source_events_without_id": result.source_unkeyed,
            "undecodable_aggregates": result.undecodable,
            "undecodable_examples": list(result.undecodable_examples),
            "before_start": result.before_start,
            "dropped_aggregates": result.dropped,
            "dropped_examples": list(result.dropped_examples),
            "target_stream": result.target_stream,
            "dead_letter_stream": result.dead_letter_stream,
            "positions_unknown": result.positions_unknown,
            **result.report.to_json(),
            "ok": result.ok,
            "complete": result.complete,
        }
    )
