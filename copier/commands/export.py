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
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import gzip
import json
import sys
from pathlib import Path
from typing import IO, Any

from copier.adapters.streamreader import Progress, StreamReader, make_client
from copier.core.config import load_config

__all__ = ["add_arguments", "export_stream", "main"]


_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _instant_ms(text: str, now_ms: int | None = None) -> int:
    """A time in epoch milliseconds, given as export writes them (``1700000000123``), as ISO 8601 (UTC when
    no zone is given), or relative to now (``-2h``, ``-30m``, ``-45s``, ``-1d``)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    if text.startswith("-") and text[-1:] in _UNITS_MS and text[1:-1].isdigit():
        now = dt.datetime.now(dt.UTC).timestamp() * 1000 if now_ms is None else now_ms
        return int(now) - int(text[1:-1]) * _UNITS_MS[text[-1]]
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (epoch milliseconds, ISO 8601 such as 2026-11-23T10:00:00Z, or -2h/-30m/-1d)"
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
    when = "epoch ms, ISO 8601 or relative (-2h, -30m, -1d)"
    parser.add_argument(
        "--since", type=_instant_ms, metavar="TIME", help=f"only records that arrived at or after ({when})"
    )
    parser.add_argument("--until", type=_instant_ms, metavar="TIME", help=f"only records that arrived before ({when})")


def _arrival_ms(record: dict[str, Any]) -> int:
    arrival = record.get("ApproximateArrivalTimestamp")
    return int(arrival.timestamp() * 1000) if isinstance(arrival, dt.datetime) else 0


def export_stream(
    reader: StreamReader,
    stream: str,
    out: Path,
    compress: bool,
    since_ms: int | None,
    until_ms: int | None,
    progress: Progress | None = None,
) -> tuple[int, int]:
    """Write the stream's records; returns (records written, files). Progress lines go to stderr."""
    shards = reader.shards(stream)  # before the directory: a stream that cannot be listed leaves nothing behind
    out.mkdir(parents=True, exist_ok=True)
    order = 0
    files = 0
    if progress is not None:
        progress.start(stream, len(shards))
    for shard in shards:
        shard_id = shard["ShardId"]
        path = out / f"{stream}-{shard_id}.jsonl{'.gz' if compress else ''}"
        handle: IO[str] = gzip.open(path, "wt", encoding="utf-8") if compress else path.open("w", encoding="utf-8")
        files += 1
        with handle:
            for page in reader.pages(stream, shard_id):
                if progress is not None:
                    progress.records(stream, len(page))
                for record in page:
                    arrival = _arrival_ms(record)
                    if (since_ms is not None and arrival < since_ms) or (until_ms is not None and arrival >= until_ms):
                        continue
                    line = {
                        "order": order,
                        "shardId": shard_id,
                        "sequenceNumber": record["SequenceNumber"],
                        "partitionKey": record["PartitionKey"],
                        "arrival": arrival,
                        "data": base64.b64encode(bytes(record["Data"])).decode(),
                    }
                    handle.write(json.dumps(line, separators=(",", ":")) + "\n")
                    order += 1
        if progress is not None:
            progress.shard_done(stream)
    return order, files


def main(args: argparse.Namespace) -> int:
    config = load_config(args.properties)
    names = {"target": config.target_stream_name, "staging": config.stream_name}
    if config.dead_letter_stream_name:
        names["deadletter"] = config.dead_letter_stream_name
    stream = names.get(args.stream, args.stream)
    target_side = stream in (config.target_stream_name, config.dead_letter_stream_name)
    progress = Progress()
    reader = StreamReader(make_client(config, target_side), progress)
    written, files = export_stream(reader, stream, Path(args.out), args.gzip, args.since, args.until, progress)
    print(f"export: {stream}: {written} records in {files} files under {args.out}", file=sys.stderr)
    return 0
