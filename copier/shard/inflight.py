"""A chunk left in flight by an earlier owner: find out what of it landed, instead of sending it again blindly.

After a takeover (or a take-back) the digest batch above the committed index,
if there is one, is a chunk whose put may have landed in part. It is
verified under the settings it was recorded with (its target, dead-letter
stream and dedup key), whatever this processor's own are: a bounded read of
the destination, then ``copier.core.recovery.resolve`` says what landed and what
is to be sent again (the redo set), and the verified batch is committed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace

from copier.core.errors import FatalAwsError
from copier.core.identity import content_digest, identity_of
from copier.core.packing import unpack_digests
from copier.core.ports import Found
from copier.core.recovery import resolve
from copier.core.state import DigestBatch, ShardState
from copier.shard.session import ShardSession

__all__ = ["InFlight"]


class InFlight:
    """Verification of the chunk a previous owner left in flight."""

    def __init__(self, session: ShardSession) -> None:
        self.s = session

    def verify(self, seen: ShardState | None) -> None:
        """Verify the digest batch above the committed index, if one was left; FencedError goes up."""
        s = self.s
        assert s.state is not None
        index = s.state.batches + 1
        in_flight = s.retrying("get_batch", lambda: s.store.get_batch(s.key, index))
        if in_flight is not None:
            self._verify(in_flight, seen)

    def _verify(self, batch: DigestBatch, seen: ShardState | None) -> None:
        """Find out which records of a batch left in flight landed (see copier.core.recovery); commit it.

        Bounded read: only the target shards the batch's entries hash to (and
        their descendants; every shard when something is missing there), and
        only from the batch's start (minus its writer's clock margin) to the
        end of the last lease its writer could have held, plus the put timeout
        and the margin. After that no put of it can land. The lease is kept
        while reading (a read of many shards at 5 GetRecords a second can
        outlast it); a fence raises FencedError.

        A read that starts within the stream's retention of now may miss
        records that expired: what it does not find is sent again and
        reported as possible duplicates (the redo set is marked suspect).
        """
        s = self.s
        settings = s.stored_settings(batch.settings, f"{batch.key} settings")
        skew, timeout, lease = s.config.clock_skew_millis, s.config.put_timeout_millis, s.config.lease_millis
        since = batch.started_ms - max(skew, batch.clock_bound_ms or 0)
        lease_end = max(seen.lease_until_ms if seen else 0, batch.started_ms + lease)
        owner_bound = max(seen.clock_bound_ms or 0 if seen else 0, batch.clock_bound_ms or 0)
        until = lease_end + timeout + max(skew, owner_bound)
        target = settings.target_stream or s.config.target_stream_name
        key = settings.dedup_key

        def read_target(shards: Collection[int] | None) -> Found:
            return self._read_recorded(
                "verify_target",
                target,
                lambda: s.streams.read_identities(
                    target,
                    shards,
                    since,
                    until,
                    lambda pk, data: identity_of(key, pk, data, settings.typed_ids, settings.key_count),
                    s.keep_lease,
                ),
            )

        found_target = Found()
        suspect = False
        if batch.keyed:
            found_target = read_target(batch.target_shards or None)
            suspect = s.beyond_retention(target, since)
        found_dlq = Found()
        dlq = settings.dead_letter_stream
        if batch.deadletter and dlq:
            found_dlq = self._read_recorded(
                "verify_deadletter",
                dlq,
                lambda: s.streams.read_identities(dlq, None, since, until, content_digest, s.keep_lease),
            )
            suspect = suspect or s.beyond_retention(dlq, since)
        state = s.state
        assert state is not None
        redo = (state.redo_last, state.redo_digests, settings.encode())  # the batch's settings, "" spelled out
        result = resolve(batch, found_target.identities, found_dlq.identities, *redo)
        if result.missing and batch.keyed and batch.target_shards:
            # Not where their keys hash to: the target may ignore keys (RecordDistributionStrategy = AUTO, even
            # switched since): every shard, before anything is sent again.
            found_target = read_target(None)
            result = resolve(batch, found_target.identities, found_dlq.identities, *redo)
        s.log.info(
            "verified_pending",
            batch=batch.index,
            batch_epoch=batch.epoch,
            landed=result.landed,
            to_redo=result.missing,
            unkeyed_resent=result.unkeyed_resent,
            redo_until=str(result.redo_last),
            records_read=found_target.records_read + found_dlq.records_read,
            shards_read=found_target.shards_read + found_dlq.shards_read,
            read_from_ms=since,
            read_until_ms=until,
            settings_changed=bool(batch.settings) and batch.settings != s.settings().encode(),
        )
        if batch.unkeyed:  # resent when the daemon replays them, whether or not they landed: said first
            # From the chunk's start (``since``), not now: the extra copy may be the first owner's, landed before
            # this redo (the resend going to the dead-letter stream under a policy changed since, say).
            s.possible_duplicates(
                batch.index,
                (),
                since,
                "a chunk in flight is redone: its records without an event ID are sent again, since a verification "
                "cannot tell their copies from identical records",
                unkeyed=unpack_digests(batch.unkeyed),
            )
        if suspect and result.missing:
            s.log.warning(
                "verification_beyond_retention",
                batch=batch.index,
                to_redo=result.missing,
                read_from_ms=since,
                detail="the chunk's records may have expired from the target before this read: what was not "
                "found is sent again and reported as possible duplicates",
            )
        if batch.epoch < state.epoch:
            # Sealed under this epoch before the state vouches for it: a fenced writer of a lower epoch whose
            # write of this index is still on its way can no longer replace what was verified (its IDs would
            # enter every later window as forwarded, and the records it names that were not would be lost).
            sealed = replace(batch, epoch=state.epoch)
            s.retrying("seal_batch", lambda: s.store.put_batch(s.key, sealed))
        verified = replace(
            state,
            batches=batch.index,
            redo_last=result.redo_last,
            redo_digests=result.redo_digests,
            redo_settings=result.redo_settings,
            redo_suspect=state.redo_suspect or (suspect and result.missing > 0),
        )
        s.write(verified.with_counts(already_landed=result.landed))

    def _read_recorded(self, call: str, stream: str, read: Callable[[], Found]) -> Found:
        """A verification read of a stream a chunk in flight was put to. A stream the current configuration no
        longer names and that no longer exists took what the chunk put there with it: nothing is found (the
        chunk is redone under the current configuration) rather than a host-wide fault on every restart."""
        s = self.s
        try:
            return s.retrying(call, read)
        except FatalAwsError as exc:
            current = (s.config.target_stream_name, s.config.dead_letter_stream_name)
            if exc.code != "ResourceNotFoundException" or stream in current:
                raise
            s.log.warning(
                "verification_stream_gone",
                stream=stream,
                detail="the stream a chunk in flight was put to no longer exists, nor does the configuration "
                "name it: what the chunk put there is gone with it; it is redone under the current configuration",
            )
            return Found()
