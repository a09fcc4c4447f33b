"""Speaking the MultiLang protocol to a record processor over pipes, as the KCL daemon does.

The daemon writes one JSON action per line to the child's stdin and reads
JSON lines from its stdout: a ``status`` line acknowledges each action, and
``checkpoint`` lines are requests it answers with a ``checkpoint`` line
(``error`` set when the checkpoint failed). Anything else on stdout would
break the real daemon, so this speaker raises :class:`ProtocolViolation` on it.

The protocol tests drive ``copier process`` with it; the benchmarks drive
``copier process`` and a plain baseline processor the same way, so both pay
the same protocol costs.
"""

from __future__ import annotations

import base64
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from copier.local.backend import DUMMY_ENV

COPIER = str(Path(sys.executable).with_name("copier"))


@dataclass(frozen=True)
class Rec:
    """A staging record as the daemon delivers it (already de-aggregated)."""

    seq: int
    data: bytes
    partition_key: str = "pk"
    subseq: int = 0
    arrival_ms: int | None = 1_700_000_000_000  # None: a record the daemon has no arrival time for

    def to_json(self) -> dict[str, Any]:
        return {
            "action": "record",
            "data": base64.b64encode(self.data).decode(),
            "partitionKey": self.partition_key,
            "sequenceNumber": str(self.seq),
            "subSequenceNumber": self.subseq,
            "approximateArrivalTimestamp": self.arrival_ms,
        }


def event(seq: int, event_id: str | None, body: str = "x", subseq: int = 0, pk: str | None = None) -> Rec:
    payload: dict[str, Any] = {"body": body}
    if event_id is not None:
        payload["eventId"] = event_id
    return Rec(seq, json.dumps(payload).encode(), pk or (event_id or "none"), subseq)


def records_message(entries: Sequence[tuple[str, bytes]], first_seq: int, arrival_ms: int = 1_700_000_000_000) -> str:
    """A processRecords action for (partition key, data) entries at consecutive sequence numbers."""
    records = [
        {
            "action": "record",
            "data": base64.b64encode(data).decode(),
            "partitionKey": key,
            "sequenceNumber": str(first_seq + i),
            "subSequenceNumber": 0,
            "approximateArrivalTimestamp": arrival_ms + i,
        }
        for i, (key, data) in enumerate(entries)
    ]
    return json.dumps({"action": "processRecords", "records": records, "millisBehindLatest": 0})


class ProtocolViolation(AssertionError):
    pass


@dataclass
class Processor:
    """One record processor child (``copier process`` unless ``command`` says otherwise) and the daemon's side."""

    properties: Path
    name: str = "processor"
    command: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)  # set in the child's environment besides this one's
    proc: subprocess.Popen[str] = field(init=False)
    checkpoints: list[tuple[str | None, int | None]] = field(default_factory=list)
    stderr_lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        env = {**os.environ, **DUMMY_ENV, **self.env}
        self.proc = subprocess.Popen(
            self.command or [COPIER, "process", "--properties", str(self.properties)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=env,
        )
        self._out: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump_out, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._out.put(line)
        self._out.put(None)

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_lines.append(line.rstrip("\n"))

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for line in list(self.stderr_lines):
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"event": "raw", "line": line})
        return out

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.logs() if e.get("event") == name]

    def wait_for(self, name: str, count: int = 1, timeout: float = 10) -> list[dict[str, Any]]:
        """The log events called ``name`` once there are ``count`` (stderr is read by another thread)."""
        deadline = time.monotonic() + timeout
        while len(found := self.events(name)) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no {count} x {name!r} in its log; tail: {self.stderr_lines[-5:]}")
            time.sleep(0.01)
        return found

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def next_status(self, timeout: float, checkpoint_error: str | list[str | None] | None = None) -> str | None:
        """Serve checkpoint requests until a status arrives (its ``responseFor``) or ``timeout`` passes (None).

        ``checkpoint_error``: the error every checkpoint is answered with, or
        a list of answers for successive checkpoints (None: it passed; past
        the list's end every checkpoint passes).
        """
        errors = list(checkpoint_error) if isinstance(checkpoint_error, list) else None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                line = self._out.get(timeout=remaining)
            except queue.Empty:
                return None
            if line is None:
                raise ProtocolViolation(
                    f"{self.name} exited ({self.proc.wait()}); stderr tail: " + "\n".join(self.stderr_lines[-10:])
                )
            if not line.strip():
                continue  # amazon-kclpy surrounds each line with newlines
            try:
                reply = json.loads(line)
            except ValueError:
                raise ProtocolViolation(f"{self.name} wrote a non-protocol line to stdout: {line!r}") from None
            if reply.get("action") == "checkpoint":
                self.checkpoints.append((reply.get("sequenceNumber"), reply.get("subSequenceNumber")))
                self._send(
                    {
                        "action": "checkpoint",
                        "sequenceNumber": reply.get("sequenceNumber"),
                        "subSequenceNumber": reply.get("subSequenceNumber"),
                        "error": (errors.pop(0) if errors else None) if errors is not None else checkpoint_error,
                    }
                )
                continue
            if reply.get("action") == "status":
                return str(reply.get("responseFor"))
            raise ProtocolViolation(f"{self.name}: unexpected message {reply!r}")

    def call(
        self, message: dict[str, Any], timeout: float = 60, checkpoint_error: str | list[str | None] | None = None
    ) -> None:
        """Send an action and serve checkpoint requests until the child acknowledges it."""
        self._send(message)
        status = self.next_status(timeout, checkpoint_error)
        if status is None:
            raise TimeoutError(f"{self.name}: no status for {message['action']} in {timeout}s")
        if status != message["action"]:
            raise ProtocolViolation(f"{self.name}: status for {status} while waiting for {message['action']}")

    # -- the daemon's actions -----------------------------------------------------

    def initialize(self, shard_id: str, seq: str = "TRIM_HORIZON", subseq: int = 0, timeout: float = 60) -> None:
        self.call(
            {"action": "initialize", "shardId": shard_id, "sequenceNumber": seq, "subSequenceNumber": subseq}, timeout
        )

    def process(self, records: list[Rec], timeout: float = 120) -> None:
        self.call(
            {"action": "processRecords", "records": [r.to_json() for r in records], "millisBehindLatest": 0},
            timeout,
        )

    def process_json(self, message: str, timeout: float = 600) -> None:
        """A processRecords action already encoded (the benchmarks encode theirs before timing)."""
        self.process_bytes(message.encode("utf-8"), timeout)

    def cpu_seconds(self) -> float:
        """The child's own user + system CPU time so far (from /proc: its ticks, 10 ms on Linux)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def process_bytes(self, line: bytes, timeout: float = 600) -> None:
        """A processRecords action as the very bytes the daemon writes (UTF-8, or its JVM's charset if not)."""
        stdin = self.proc.stdin
        assert isinstance(stdin, io.TextIOWrapper)
        stdin.flush()
        stdin.buffer.write(line + b"\n")
        stdin.buffer.flush()
        status = self.next_status(timeout)
        if status != "processRecords":
            raise ProtocolViolation(f"{self.name}: {status} while waiting for processRecords")

    def send_process(self, records: list[Rec]) -> None:
        """Send a batch without waiting (to kill the child while it works on it)."""
        self._send({"action": "processRecords", "records": [r.to_json() for r in records], "millisBehindLatest": 0})

    def shard_ended(self, checkpoint_error: str | list[str | None] | None = None) -> None:
        self.call({"action": "shardEnded"}, checkpoint_error=checkpoint_error)

    def shutdown_requested(self) -> None:
        self.call({"action": "shutdownRequested"})

    def lease_lost(self) -> None:
        self.call({"action": "leaseLost"})

    def last_checkpoint(self) -> tuple[str | None, int | None] | None:
        return self.checkpoints[-1] if self.checkpoints else None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self) -> int:
        """End of input, as when the daemon goes away; returns the exit status."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                return self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()
