"""Reads that survive an interruption: records written shard by shard to JSON-lines files, a checkpoint after every
page, so that a command run again on the same directory goes on where the last run stopped.

``copier export`` writes its output this way (the files are what it
makes), ``copier verify --spool DIR`` keeps what it read (the streams are
read again only from where the kept records end). A read of a large stream
takes hours within the Kinesis read limits; Ctrl-C, a SIGKILL or a lost
session must not cost them.

One file a shard, ``<name>.jsonl`` (``.jsonl.gz`` compressed), each record
one line (:func:`record_line`; ``copier export`` adds its ``order``)::

    {"shardId": "shardId-000000000001", "sequenceNumber": "4959...", "partitionKey": "k",
     "arrival": 1700000000123, "data": "<base64 of the record>"}

and one checkpoint for the directory, :data:`CHECKPOINT` (a dot file: the
audit job and Spark skip it), holding what the read is (a run of another
read on the same directory is refused, not mixed in) and for each shard the
last sequence number read, the lines written and the file's length.

An export of the dead-letter stream also keeps :data:`REDRIVEN`: the digest
names of what redrives had sent on to the target when it was made, one a
line (``copier.commands.verify.redriven_record``), so that ``copier audit``
counts a redriven event's target copy, not its dead-letter record, as
``copier verify`` does. Its name starts with ``_``: Spark and Hadoop skip it
when they read the directory's records, as they skip ``_SUCCESS``.

Why it survives any stop: a page's lines are appended (compressed: as a
gzip member of their own, which every gzip reader reads as one stream with
the others), then the checkpoint is replaced atomically (written beside,
flushed to disk, renamed). What a run wrote after its last checkpoint (a
page cut short) is cut off when the file is opened again, and that page is
read again from Kinesis, after the last sequence number the checkpoint
names: nothing is missing and nothing is written twice.
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import json
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from copier.core.errors import ConfigError

__all__ = [
    "CHECKPOINT",
    "REDRIVEN",
    "ShardFiles",
    "ShardMark",
    "arrival_ms",
    "record_line",
    "record_of",
    "write_redriven",
]

CHECKPOINT = ".copier-progress.json"
REDRIVEN = "_redriven.txt"


def arrival_ms(record: Mapping[str, Any]) -> int:
    """A record's ``ApproximateArrivalTimestamp`` in epoch milliseconds (0: none)."""
    arrival = record.get("ApproximateArrivalTimestamp")
    return int(arrival.timestamp() * 1000) if isinstance(arrival, dt.datetime) else 0


def record_line(shard_id: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """A record as a line of a shard's file."""
    return {
        "shardId": shard_id,
        "sequenceNumber": record["SequenceNumber"],
        "partitionKey": record["PartitionKey"],
        "arrival": arrival_ms(record),
        "data": base64.b64encode(bytes(record["Data"])).decode(),
    }


def record_of(line: Mapping[str, Any]) -> dict[str, Any]:
    """A line read back as GetRecords gives the record (what the read's converters take)."""
    arrival = int(line.get("arrival") or 0)
    return {
        "SequenceNumber": line["sequenceNumber"],
        "PartitionKey": line["partitionKey"],
        "Data": base64.b64decode(line["data"]),
        "ApproximateArrivalTimestamp": dt.datetime.fromtimestamp(arrival / 1000, dt.UTC) if arrival else None,
    }


def _replace(path: Path, text: str) -> None:
    """``path`` holds ``text`` or what it held before, never part of it: written beside, flushed, renamed."""
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def write_redriven(directory: Path, names: Iterable[str]) -> Path:
    """The redrive record (:data:`REDRIVEN`, see the module docstring) written in ``directory``, whole."""
    path = directory / REDRIVEN
    _replace(path, "".join(f"{name}\n" for name in sorted(names)))
    return path


@dataclass(frozen=True)
class ShardMark:
    """Where a shard's read stands at the checkpoint."""

    last: str | None = None  # the sequence number of the last record read (None: none yet)
    lines: int = 0  # lines in the file
    size: int = 0  # the file's length, in bytes
    ended: bool = False  # nothing more to read: the caller said so (a closed shard read to its end, say)


class ShardFiles:
    """A directory of shard files and its checkpoint; see the module docstring. Thread-safe: shards are read in
    parallel, each by one thread.

    ``what``: what the read is (JSON values); a checkpoint left by another
    read refuses the directory (ConfigError: a wrong argument, exit 2). With
    no checkpoint, the read starts afresh and a file already there is
    overwritten when its shard is opened. ``settled``: what the first run
    fixed for the whole read (a relative time, ``-2h``, resolved): kept in
    the checkpoint, and when resuming :attr:`settled` is the first run's.
    """

    def __init__(
        self,
        directory: Path,
        what: Mapping[str, Any],
        compress: bool = False,
        settled: Mapping[str, Any] | None = None,
    ) -> None:
        self.directory = directory
        self.what = dict(what)
        self.settled = dict(settled or {})
        self.compress = compress
        self._lock = threading.Lock()
        self._marks: dict[str, ShardMark] = {}
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / CHECKPOINT
        self.resumed = path.exists()
        if self.resumed:
            kept = json.loads(path.read_text(encoding="utf-8"))
            if kept.get("what") != self.what:
                raise ConfigError(
                    str(directory),
                    "",
                    f"holds another read ({json.dumps(kept.get('what'), sort_keys=True)}, not "
                    f"{json.dumps(self.what, sort_keys=True)}): give another directory, or delete {path} to start "
                    "over there",
                )
            self._marks = {name: ShardMark(*mark) for name, mark in kept["shards"].items()}
            self.settled = dict(kept.get("settled") or {})

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.jsonl{'.gz' if self.compress else ''}"

    def open(self, name: str) -> ShardMark:
        """Start or resume a shard: its file cut back to the checkpoint (created empty if new); where it stands."""
        with self._lock:
            mark = self._marks.get(name, ShardMark())
            self._marks[name] = mark
        with self.path(name).open("ab") as handle:
            handle.truncate(mark.size)
        return mark

    def lines(self, name: str) -> Iterator[dict[str, Any]]:
        """The lines written by earlier runs, up to the checkpoint (after :meth:`open`)."""
        path = self.path(name)
        if not self._marks[name].size:
            return
        with gzip.open(path, "rt", encoding="utf-8") if self.compress else path.open(encoding="utf-8") as handle:
            for line in handle:
                yield json.loads(line)

    def append(self, name: str, lines: Sequence[Mapping[str, Any]], last: str | None, ended: bool = False) -> ShardMark:
        """A page's lines written, then the checkpoint moved past them (``last``: the last record read, written
        or not; ``ended``: nothing more to read)."""
        path = self.path(name)
        if lines:
            text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode("utf-8")
            with path.open("ab") as handle:
                handle.write(gzip.compress(text) if self.compress else text)
                handle.flush()
                os.fsync(handle.fileno())
        with self._lock:
            before = self._marks[name]
            mark = ShardMark(last or before.last, before.lines + len(lines), path.stat().st_size, ended)
            self._marks[name] = mark
            self._save()
        return mark

    def done(self) -> None:
        """The read is complete: the checkpoint goes (a run on the directory starts afresh)."""
        (self.directory / CHECKPOINT).unlink(missing_ok=True)

    def _save(self) -> None:
        """The checkpoint replaced atomically (lock held): written beside, flushed to disk, renamed."""
        shards = {name: [m.last, m.lines, m.size, m.ended] for name, m in self._marks.items()}
        kept = {"what": self.what, "settled": self.settled, "shards": shards}
        _replace(self.directory / CHECKPOINT, json.dumps(kept, separators=(",", ":")))
