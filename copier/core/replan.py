"""Re-planning the entries of a chunk in flight that a stream's changed record limit refuses.

A chunk is planned under the record limits DescribeStreamSummary gave
(``PlanSettings.max_record_bytes``, ``dead_letter_max_bytes``); the limit
can be lowered (``UpdateMaxRecordSize``) while the chunk is being put, and
Kinesis then refuses every request holding a record over the new limit, as a
whole, again and again. Pure decisions, the engine does the I/O
(``copier.shard.pipeline``):

* :func:`replan`: what the refused entries become under the settings read
  again. Only moves a changed limit makes: a record over the target's limit
  goes to the dead-letter stream, an envelope over the dead-letter stream's
  keeps the payload's SHA-256 instead. Nothing moves into the target (a
  record there would land after the chunk's later entries of its key, and
  its dead-letter copy is as good): an entry bound for the dead-letter
  stream stays bound there, whatever the target's limit says now, and is
  wrapped again under the dead-letter stream's limit, with the reason it
  was first dead-lettered for. An entry the settings still send as it was
  stays: its refusal is not a limit's, and the shard stalls.
* :func:`rerouted_batch`: the chunk's digest batch as the re-plan leaves it,
  written at the same index, epoch and start, one revision up, before any
  re-planned entry is put. Its columns say where each entry goes now (a
  successor reads the target for the ``keyed`` ones and the dead-letter
  stream for the ``deadletter`` ones), its ``settings`` are those of the
  re-plan, and ``redo_ids`` keep each entry's identity under the settings
  the chunk was first planned under (or the redo set's it consumed), which
  ``redo_settings`` names: what a successor does not find joins the redo
  set in those identities, and a replayed record is matched by what it
  became under them (``copier.core.plan``), wherever it goes now. The
  identities cannot follow the re-plan's settings: an entry of the chunk
  that landed in the target before the limit was lowered may be over it,
  and under those settings it would be a dead-letter envelope.

Why the revision: a writer whose first write of the batch got no answer
retries it; the first attempt may reach the table after the re-plan's
write. Applied, it would put back the batch that names a dead-lettered entry
as a target entry; a successor would not find it in the target and put it
again, to the dead-letter stream, where its first copy is: a duplicate. The
store refuses a batch of the same epoch and a lower revision
(``StateStore.put_batch``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TypedDict

from copier.core.identity import content_digest
from copier.core.packing import pack_digests, unpack_digests
from copier.core.plan import BatchPlan, Outgoing, PlanSettings, SourceRecord, becomes, dead_letter_envelope
from copier.core.positions import Position
from copier.core.state import DigestBatch

__all__ = ["Columns", "columns", "replan", "rerouted_batch", "with_columns"]


def replan(
    refused: Sequence[Outgoing], records: Mapping[Position, SourceRecord], settings: PlanSettings
) -> dict[Position, Outgoing]:
    """The refused entries that change under ``settings`` (the streams' limits read again), by position."""
    out: dict[Position, Outgoing] = {}
    for entry in refused:
        record = records[entry.position]
        if entry.destination == "deadletter":
            new = _rewrapped(entry, record, settings)
        else:
            new = becomes(settings, record)
        if new.destination == "deadletter" and (new.partition_key, new.data) != (entry.partition_key, entry.data):
            out[entry.position] = new
    return out


def _rewrapped(entry: Outgoing, record: SourceRecord, settings: PlanSettings) -> Outgoing:
    """A dead-letter entry wrapped again under the dead-letter stream's limit in ``settings`` (the payload's
    SHA-256 instead of the payload when the envelope is over it), under its key and for its first reason.

    Not :func:`becomes` again: with the target's limit raised since, it would send the record to the target,
    where it would land after the chunk's later entries of its key; a re-plan moves nothing into the target."""
    reason = str(json.loads(entry.data)["reason"])  # copier's own envelope (plan.dead_letter_envelope)
    envelope = dead_letter_envelope(settings, record, reason)
    return entry._replace(data=envelope, identity=content_digest(entry.partition_key, envelope), b64=None)


class Columns(TypedDict):
    """A digest batch's digest columns (``DigestBatch``: where each entry goes)."""

    keyed: bytes
    unkeyed: bytes
    deadletter: bytes
    dead_ids: bytes
    before_ids: bytes


def columns(plan: BatchPlan) -> Columns:
    """The digest columns of what ``plan`` sends, for a new batch (``DigestBatch(..., **columns(plan))``)."""
    return Columns(
        keyed=pack_digests(plan.keyed_digests),
        unkeyed=pack_digests(plan.unkeyed_digests),
        deadletter=pack_digests(plan.deadletter_digests),
        dead_ids=pack_digests(plan.dead_ids),
        before_ids=pack_digests(plan.before_ids),
    )


def with_columns(batch: DigestBatch, plan: BatchPlan) -> DigestBatch:
    """``batch`` with the digest columns of what ``plan`` sends."""
    return replace(batch, **columns(plan))


def rerouted_batch(
    batch: DigestBatch, before: Sequence[Outgoing], plan: BatchPlan, settings: PlanSettings
) -> DigestBatch:
    """``batch`` (written for the sends ``before``) rewritten for ``plan`` as re-planned under ``settings``.

    ``before`` in the order the batch stores its entries (``BatchPlan.in_batch_order``, as it was).
    """
    ids = unpack_digests(batch.redo_ids) if batch.redo_ids else batch.entry_digests()
    if len(ids) != len(before):
        raise ValueError(f"{batch.key}: {len(ids)} identities for {len(before)} entries")
    identity = {entry.position: i for entry, i in zip(before, ids, strict=True)}
    return replace(
        with_columns(batch, plan),
        settings=settings.encode(),
        redo_ids=pack_digests(identity[o.position] for o in plan.in_batch_order()),
        redo_settings=batch.redo_settings or batch.settings,
        revision=batch.revision + 1,
    )
