"""``copier export``: a stream, or a time range of it, to JSON-lines files the audit job reads.

One file per shard, ``<stream>-<shardId>.jsonl`` (``.jsonl.gz`` with
``--gzip``), shards in lineage order (parents before children), each record
one line::

    {"order": 17, "shardId": "shardId-000000000001", "sequenceNumber": "4959...",
     "partitionKey": "k", "arrival": 1700000000123, "data": "<base64 of the record>"}

``order`` numbers the records across the whole export in the order
``copier verify`` reads the stream, which is what per-partition-key order is
judged by. Reads stay within the Kinesis read limits (``copier verify``'s
reader, ``copier.adapters.streamreader``) and go through the target's credentials for
the target and dead-letter streams. Records are written as they are read:
memory does not grow with the stream.

Progress goes to stderr (a bar on a terminal, a line every few seconds in a
log). An export interrupted (Ctrl-C, a kill, a lost session) goes on where
it stopped when run again with the same arguments: each page is written
with a checkpoint (``copier.adapters.shardfiles``, the dot file
``.copier-progress.json`` in ``--out``), shards done are not read again, the
shard it was in is read on after its last record kept, and ``order`` goes on
from where it was (a relative ``--since -2h`` keeps the time its first run
resolved). The checkpoint is removed once the export is complete,
so a run on a complete directory starts afresh (overwriting it), as one on
a directory of another export (other arguments) is refused.

An export of the dead-letter stream also writes what redrives had sent on
to the target by its end (``_redriven.txt``, from the redrive state items:
``copier.adapters.shardfiles.REDRIVEN``), which ``copier audit`` reads with
the dead-letter files so that a redriven event counts once, by its target
copy, as ``copier verify`` counts it. When the state table cannot be read
it says so and writes none (the audit then says it has no such record).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import NamedTuple

from copier.adapters.localkeys import command_config
from copier.adapters.progress import Progress
from copier.adapters.shardfiles import REDRIVEN, ShardFiles, arrival_ms, record_line, write_redriven
from copier.adapters.streamreader import StreamReader, make_client
from copier.core.config import Config

__all__ = ["add_arguments", "export_stream", "main"]


_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class Instant(NamedTuple):
    """A time as given (``-2h``) and as resolved now: an export goes on with the times its first run resolved."""

    text: str
    ms: int


def _instant(text: str) -> Instant:
    return Instant(text, _instant_ms(text))


def _instant_ms(text: str, now_ms: int | None = None) -> int:
    """A time in epoch milliseconds, given as export writes them (``1700000000123``), as ISO 8601 (UTC when
    no zone is given), relative to now (``-2h``, ``-30m``, ``-45s``, ``-1d``), or ``now``."""
    text = text.strip()
    if text.lower() == "now":
        return int(dt.datetime.now(dt.UTC).timestamp() * 1000) if now_ms is None else now_ms
    if text.isdigit():
        return int(text)
    if text.startswith("-") and text[-1:] in _UNITS_MS and text[1:-1].isdigit():
        now = dt.datetime.now(dt.UTC).timestamp() * 1000 if now_ms is None else now_ms
        return int(now) - int(text[1:-1]) * _UNITS_MS[text[-1]]
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (epoch milliseconds, ISO 8601 such as 2026-11-23T10:00:00Z, -2h/-30m/-1d, or now)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--properties", required=True, metavar="FILE", help="the copier's properties file")
    parser.add_argument(
        "--stream", default="target", help="target, deadletter, staging, or a stream name (default: target)"
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for the files (created)")
    parser.add_argument("--gzip", action="store_true", help="write .jsonl.gz files")
    when = "epoch ms, ISO 8601, relative (-2h, -30m, -1d) or now"
    parser.add_argument(
        "--since", type=_instant, metavar="TIME", help=f"only records that arrived at or after ({when})"
    )
    parser.add_argument("--until", type=_instant, metavar="TIME", help=f"only records that arrived before ({when})")


def export_stream(
    reader: StreamReader,
    stream: str,
    out: Path,
    compress: bool,
    since: Instant | int | None,
    until: Instant | int | None,
) -> tuple[int, int]:
    """Write the stream's records that arrived in [since, until), going on from an interrupted export of the same
    arguments into ``out`` (with the times its first run resolved); returns (records written, files). Progress
    goes to the reader's."""
    shards = reader.shards(stream)  # before the directory: a stream that cannot be listed leaves nothing behind
    given = {"since": _given(since), "until": _given(until)}
    resolved = {"since_ms": _ms(since), "until_ms": _ms(until)}
    files = ShardFiles(out, {"export": stream, **given, "gzip": compress}, compress, resolved)
    since_ms, until_ms = files.settled["since_ms"], files.settled["until_ms"]
    order = 0
    progress = reader.progress
    progress.start(stream, len(shards))
    for shard in shards:
        shard_id = shard["ShardId"]
        name = f"{stream}-{shard_id}"
        mark = files.open(name)
        order += mark.lines
        progress.records(stream, mark.lines)
        if not mark.ended:
            for page in reader.pages(stream, shard_id, mark.last, stream):
                lines: list[dict[str, object]] = []
                for record in page:
                    arrival = arrival_ms(record)
                    if (since_ms is not None and arrival < since_ms) or (until_ms is not None and arrival >= until_ms):
                        continue
                    lines.append({"order": order + len(lines), **record_line(shard_id, record)})
                files.append(name, lines, page[-1]["SequenceNumber"])
                order += len(lines)
                progress.records(stream, len(page))
            files.append(name, [], None, ended=True)  # read to its end now: an export is a snapshot
        progress.shard_done(stream, shard_id)
    files.done()
    return order, len(shards)


def _given(when: Instant | int | None) -> str | int | None:
    return when.text if isinstance(when, Instant) else when


def _ms(when: Instant | int | None) -> int | None:
    return when.ms if isinstance(when, Instant) else when


def main(args: argparse.Namespace) -> int:
    config = command_config(args.properties)
    names = {"target": config.target_stream_name, "staging": config.stream_name}
    if config.dead_letter_stream_name:
        names["deadletter"] = config.dead_letter_stream_name
    stream = names.get(args.stream, args.stream)
    target_side = stream in (config.target_stream_name, config.dead_letter_stream_name)
    progress = Progress(command="export")
    reader = StreamReader(make_client(config, target_side), progress)
    try:
        written, files = export_stream(reader, stream, Path(args.out), args.gzip, args.since, args.until)
    except KeyboardInterrupt:
        progress.finish()
        print(f"export: interrupted; the same command again goes on from what {args.out} holds", file=sys.stderr)
        raise
    progress.finish()
    print(f"export: {stream}: {written} records in {files} files under {args.out}", file=sys.stderr)
    if stream == config.dead_letter_stream_name:
        _keep_redriven(config, reader, Path(args.out))
    return 0


def _keep_redriven(config: Config, reader: StreamReader, out: Path) -> None:
    """What redrives sent, beside the dead-letter files (the module docstring), read after them: a record
    redriven meanwhile is named, and its target copy is in an export of the target made after this one."""
    from copier.commands.verify import redriven_record

    names = redriven_record(config, reader)
    if names is None:
        (out / REDRIVEN).unlink(missing_ok=True)
        print(
            f"export: the redrive state items could not be read: no {REDRIVEN} written (copier audit will count a "
            "redriven event's dead-letter record as a copy)",
            file=sys.stderr,
        )
        return
    write_redriven(out, names)
    print(f"export: {len(names)} names of what redrives sent in {out / REDRIVEN}", file=sys.stderr)
