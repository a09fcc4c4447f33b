"""``python -m copier.bench.audit``: ``copier audit`` (Spark) against verify's in-memory audit, at scale.

    python -m copier.bench.audit --events 5000000 --workdir /tmp/audit-bench

Writes synthetic ``copier export`` files of N events (about 1 in 100,000
lost, 1 in 100,000 duplicated, spread over 8 shards, 1,000 partition keys)
and their manifest, then runs, each in a process of its own, (1) what
``copier verify`` does once it has read the streams: every target record as
a ``TargetRecord`` in one Python process and ``copier.core.audit.audit`` over them
(the records read from the export files instead of Kinesis, so both sides
see the same data), and (2) ``copier audit`` in Spark local mode. It prints
wall time and peak resident memory of each (the whole process tree, sampled:
for the audit, the Python driver, the Spark JVM and its Python workers) and
checks that the two reports agree.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SHARDS = 8
KEYS = 1000


def write_data(workdir: Path, events: int) -> tuple[Path, Path]:
    """Export files (gzip, one per shard) and a manifest; returns (target dir, manifest file)."""
    target = workdir / "target"
    target.mkdir(parents=True, exist_ok=True)
    manifest = workdir / "manifest.txt"
    files = [gzip.open(target / f"target-shardId-{s:012d}.jsonl.gz", "wt", compresslevel=1) for s in range(SHARDS)]
    order = 0
    with manifest.open("w") as ids:
        for n in range(events):
            event_id = f"ev-{n:010d}"
            ids.write(event_id + "\n")
            copies = 0 if n % 100_000 == 7 else 2 if n % 100_000 == 11 else 1
            for _ in range(copies):
                shard = n % SHARDS
                data = base64.b64encode(json.dumps({"eventId": event_id, "n": n}).encode()).decode()
                line = {
                    "order": order,
                    "shardId": f"shardId-{shard:012d}",
                    "sequenceNumber": str(10**20 + order),
                    "partitionKey": f"key-{n % KEYS}",
                    "arrival": 0,
                    "data": data,
                }
                files[shard].write(json.dumps(line, separators=(",", ":")) + "\n")
                order += 1
    for f in files:
        f.close()
    return target, manifest


def verify_side(target: Path, manifest: Path) -> dict[str, Any]:
    """verify's audit: every record in memory as a TargetRecord, then copier.core.audit.audit."""
    from copier.core.audit import audit
    from copier.core.auditinputs import event_id_in
    from copier.core.audittypes import TargetRecord
    from copier.core.config import DedupKey

    key = DedupKey("json", ("eventId",))
    records: list[TargetRecord] = []
    lines: list[tuple[int, TargetRecord]] = []
    for path in sorted(target.iterdir()):
        with gzip.open(path, "rt") as f:
            for line in f:
                doc = json.loads(line)
                data = base64.b64decode(doc["data"])
                record = TargetRecord(event_id_in(key, doc["partitionKey"], data), doc["partitionKey"], doc["shardId"])
                lines.append((doc["order"], record))
    lines.sort(key=lambda pair: pair[0])
    records = [r for _, r in lines]
    del lines
    produced = [line.strip() for line in manifest.open() if line.strip()]
    return audit(produced, records).to_json()


def _tree_rss_kb(root: int) -> int:
    """Resident memory of a process and all its descendants, in KB (from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree and pid not in tree}
        tree |= more
        grew = bool(more)
    total = 0
    for pid in tree:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def _measure(command: list[str]) -> tuple[float, float, str]:
    """(seconds, peak resident memory of the command's whole process tree in MB, stdout), sampled every 0.2 s."""
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL, text=True)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss_kb(proc.pid))
            time.sleep(0.2)
        seconds = time.monotonic() - started
        out.seek(0)
        stdout = out.read()
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{command[:4]} failed ({proc.returncode})")
    return seconds, peak / 1024, stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m copier.bench.audit", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--verify-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    if args.verify_side:
        print(json.dumps(verify_side(workdir / "target", workdir / "manifest.txt")))
        return 0
    started = time.monotonic()
    target, manifest = write_data(workdir, args.events)
    print(f"wrote {args.events} events in {time.monotonic() - started:.0f} s", file=sys.stderr)
    props = workdir / "audit.properties"
    props.write_text(
        "applicationName = bench\nstreamName = staging\nregionName = us-east-1\n"
        "copier.targetStreamName = target\ncopier.dedupKey = json:eventId\n"
    )
    verify_cmd = [sys.executable, "-m", "copier.bench.audit", "--workdir", str(workdir), "--verify-side"]
    v_s, v_mb, v_out = _measure(verify_cmd)
    copier = str(Path(sys.executable).with_name("copier"))
    audit_cmd = [copier, "audit", "--properties", str(props), "--manifest", str(manifest)]
    a_s, a_mb, a_out = _measure([*audit_cmd, "--target", str(target), "--json"])
    verified, audited = json.loads(v_out), json.loads(a_out)
    keys = ("expected_events", "target_records", "lost", "duplicated", "extra_copies", "unexpected", "out_of_order")
    agree = all(verified[k] == audited[k] for k in keys)
    result = {
        "events": args.events,
        "verify_seconds": round(v_s, 1),
        "verify_peak_mb": round(v_mb),
        "verify_bytes_per_event": round(v_mb * 2**20 / args.events),
        "audit_seconds": round(a_s, 1),
        "audit_peak_mb": round(a_mb),
        "reports_agree": agree,
        "counts": {k: verified[k] for k in keys},
    }
    print(json.dumps(result, indent=1))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
