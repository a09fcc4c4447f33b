"""The amazon-kclpy v3 record processor: thin glue between the daemon and a ShardWorker.

amazon-kclpy catches every exception a handler raises (all but SystemExit),
prints it and acknowledges the action anyway: a batch that raised would be
treated as done. So no handler here lets an exception out. Transient faults
are retried inside the worker until the batch is finished, and a fault AWS
reports as final for one shard's request stalls that shard inside the
worker; a fenced worker acknowledges without forwarding or checkpointing
(it holds what it is given, to take the shard back if the owner that fenced
it turns out to have lost the shard to the daemon, and at a shard's end it
waits until it can, or until that owner has closed the shard; ``copier.shard``).
What reaches this module is a fault no shard on the host can get past (a
missing table or stream, denied access, a state table of another format),
a malformed message from the daemon, or a bug: it ends the process with a
logged reason, which stops the daemon so that its supervisor restarts it.
AWS refusing requests for this host's clock stalls the shard inside the
worker instead (a restart would meet the same clock); should one come here
all the same, its line names the clock.
"""

from __future__ import annotations

import binascii
import gc
from collections.abc import Callable
from typing import IO, Any

import structlog
from amazon_kclpy import dispatch, kcl, messages
from amazon_kclpy.v3 import processor

from copier.core import fastjson
from copier.core.clockcheck import naming_the_clock
from copier.core.errors import AwsError, CopierError, ProtocolError
from copier.core.plan import SourceRecord
from copier.core.positions import Position
from copier.shard import ShardWorker

__all__ = ["CopierRecordProcessor", "EXIT_FATAL", "FastIO", "kcl_process"]

EXIT_FATAL = 3
_CHECKPOINT_RETRIES = 5
# The names the daemon answers a failed checkpoint with (KCL's exception classes).
_LEASE_GONE = "ShutdownException"  # another worker has the shard: it checkpoints from now on
_TRANSIENT = ("ThrottlingException", "KinesisClientLibDependencyException")


def _records(raw: list[dict[str, Any]]) -> list[SourceRecord]:
    """The daemon's records (as :class:`FastIO` leaves them: JSON objects) as copier's: numeric positions,
    decoded data, and the base64 kept to send on unchanged.

    What a record's content can put here never raises: the key is any string (a lone surrogate too, which
    ``copier.core.limits`` refuses per record), the data any bytes (base64 of them), the arrival any number
    the daemon's ``Long`` holds, or none. A ProtocolError (the process exits) is left for what the daemon
    itself never sends: a record without a key, data or sequence number, a key that is not a string, data
    that is not base64, a position that is not a number.
    """
    out = []
    decode = binascii.a2b_base64
    for r in raw:
        try:
            position = Position(int(r["sequenceNumber"]), int(r.get("subSequenceNumber") or 0))
            if position.seq < 0 or position.subseq < 0:
                raise ValueError(f"negative position {position}")
            key, text = r["partitionKey"], r["data"]
            if not isinstance(key, str) or not isinstance(text, str):
                raise TypeError(f"partitionKey {type(key).__name__}, data {type(text).__name__}")
            arrival = int(r.get("approximateArrivalTimestamp") or 0)
            out.append(SourceRecord(position, key, decode(text, strict_mode=True), arrival, text))
        except (ValueError, KeyError, binascii.Error, TypeError) as exc:
            raise ProtocolError(f"record from the daemon is malformed: {exc!r}") from exc
    return out


class FastIO(kcl._IOHandler):  # type: ignore[misc]
    """amazon-kclpy's I/O handler, parsing processRecords without a Python object (and a datetime) per record.

    amazon-kclpy decodes every line with an ``object_hook`` that turns each
    record into a ``Record``; at tens of thousands of records a second that
    costs more than anything copier does with a record. Here a
    processRecords line is parsed as JSON alone (through orjson where it reads
    what ``json`` reads: ``copier.core.fastjson``) and its records stay JSON
    objects (read by :func:`_records`); every other line goes through
    amazon-kclpy's own decoding. Written against amazon-kclpy 3.1.3 (pinned
    in setup.cfg); ``tests/test_processor.py`` checks it.
    """

    def load_action(self, line: str) -> Any:
        message = fastjson.loads(line)
        if isinstance(message, dict) and message.get("action") == "processRecords":
            return messages.ProcessRecordsInput(message)
        return dispatch.message_decode(message)


#: Allocations of container objects between young-generation collections (CPython's default is 700).
GC_YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """Stop the cyclic garbage collector from re-scanning what lives for the whole process.

    A processor holds tens of thousands of long-lived objects (boto3, botocore's models, structlog)
    and allocates a dict per delivered record. With CPython's defaults the collector runs every
    700 allocations and its older generations re-walk every module object: measured at 30-35% of
    the processor's CPU per event (``make bench``). Freezing what startup built moves it out of
    every later collection; a higher young threshold collects per batch rather than per few
    records. The processor's data structures are reference-counted or flat arrays, so the
    collector still reclaims the rare cycle within a batch or two.
    """
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def kcl_process(processor: Any, stdin: IO[str], stdout: IO[str], stderr: IO[str]) -> Any:
    """amazon-kclpy's protocol loop for ``processor``, reading and writing through :class:`FastIO`."""
    process = kcl.KCLProcess(processor, input_file=stdin, output_file=stdout, error_file=stderr)
    process.io_handler = FastIO(stdin, stdout, stderr)
    process.checkpointer.io_handler = process.io_handler
    return process


class CopierRecordProcessor(processor.RecordProcessorBase):  # type: ignore[misc]
    """One per staging shard, spawned by the MultiLangDaemon as ``copier process``."""

    def __init__(self, make_worker: Callable[[], ShardWorker], checkpoint_interval_ms: int) -> None:
        self.make_worker = make_worker
        self.worker: ShardWorker | None = None
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.last_checkpoint_ms = 0
        self.log = structlog.get_logger("copier")

    def _guard(self, action: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except CopierError as exc:
            said: CopierError = exc
            if isinstance(exc, AwsError) and self.worker is not None:
                said = naming_the_clock(exc, self.worker.session.clock_snapshot())
            self._logger().error("fatal", action=action, error=str(said), error_type=type(exc).__name__)
            raise SystemExit(EXIT_FATAL) from exc
        except Exception as exc:  # a bug: never let amazon-kclpy acknowledge past it
            self._logger().exception("unexpected_error", action=action, error=str(exc))
            raise SystemExit(EXIT_FATAL) from exc

    def _logger(self) -> Any:
        """The worker's logger (bound to shard and epoch) once there is one."""
        return self.worker.log if self.worker is not None else self.log

    def _checkpoint(self, checkpointer: Any, position: Position | None, until_done: bool = False) -> None:
        """Checkpoint to the KCL; failures are logged, never fatal: the state table is the truth.

        A throttled or failed lease-table call is retried a few times; a later
        checkpoint covers this one anyway. At a shard's end (``until_done``)
        every failure but a lost lease is retried until the checkpoint passes:
        the daemon asks for the end once, and a shard whose end is not
        checkpointed is never read again, nor are the shards it split or
        merged into (docs/protocol.md, "Endings").
        """
        attempt = 0
        while True:
            try:
                if position is None:
                    checkpointer.checkpoint()
                else:
                    checkpointer.checkpoint(position.seq_str, position.subseq)
                assert self.worker is not None
                self.last_checkpoint_ms = self.worker.clock.now_ms()
                return
            except kcl.CheckpointError as exc:
                error = str(exc.value) if hasattr(exc, "value") else str(exc)
                self._logger().warning("checkpoint_failed", error=error, attempt=attempt, shard_end=until_done)
                if self.worker is None or _LEASE_GONE in error:
                    return
                if not until_done and (attempt + 1 >= _CHECKPOINT_RETRIES or not any(t in error for t in _TRANSIENT)):
                    return
                self.worker.clock.sleep_ms(min(200 * (attempt + 1), self.worker.config.max_backoff_millis))
                attempt += 1

    def initialize(self, initialize_input: Any) -> None:
        def run() -> None:
            self.worker = self.make_worker()
            self.worker.initialize(initialize_input.shard_id)
            self.last_checkpoint_ms = self.worker.clock.now_ms()

        self._guard("initialize", run)

    def process_records(self, process_records_input: Any) -> None:
        def run() -> None:
            assert self.worker is not None, "processRecords before initialize"
            behind = process_records_input.millis_behind_latest
            records = _records(process_records_input.records)
            position = self.worker.process(records, int(behind) if behind is not None else None)
            if position is None:
                return
            due = self.worker.clock.now_ms() - self.last_checkpoint_ms >= self.checkpoint_interval_ms
            if due:
                self._checkpoint(process_records_input.checkpointer, position)

        self._guard("processRecords", run)

    def lease_lost(self, lease_lost_input: Any) -> None:
        if self.worker is not None:
            already = self.worker.ownership.given_up
            released = self.worker.lose_lease()  # copier's lease too, so the new owner starts at once
            # After a graceful release the daemon says so too: expected, not news.
            (self.worker.log.debug if already else self.worker.log.info)(
                "lease_lost",
                released=released,
                detail="the KCL took this shard's lease from this worker: its daemon's 'lost lease' line says "
                "whether its lease ran out here, its leader's 'Leases taken from worker' that it was a rebalance",
            )
        else:
            self.log.info("lease_lost")

    def shard_ended(self, shard_ended_input: Any) -> None:
        def run() -> None:
            assert self.worker is not None
            if self.worker.end_shard():
                self._checkpoint(shard_ended_input.checkpointer, None, until_done=True)  # no arguments: KCL #211

        self._guard("shardEnded", run)

    def input_closed(self) -> None:
        """The daemon closed this processor's input (it exited or died): give the lease up on the way out.

        A daemon stopping gracefully may hand this processor a shard moments
        before it exits (measured with KCL 3.1.3: a released lease taken back
        by the same worker during its shutdown) and never ask it to shut down;
        without this, the next owner would sleep out that lease. Records
        waiting to be coalesced are not committed, so the next owner replays
        them from the KCL checkpoint.
        """
        if self.worker is None:
            return
        try:
            self.worker.release(retry=False)
        except CopierError as exc:
            self._logger().warning("release_failed", error=str(exc))

    def shutdown_requested(self, shutdown_requested_input: Any) -> None:
        def run() -> None:
            worker = self.worker
            assert worker is not None
            worker.flush()
            if worker.state is None:
                return
            if worker.fenced:
                # nothing to checkpoint (its position is the owner's); its lease is cut to now plus the put timeout
                worker.release()
                return
            if worker.state.position is not None:
                self._checkpoint(shutdown_requested_input.checkpointer, worker.state.position)
            worker.release()

        self._guard("shutdownRequested", run)
