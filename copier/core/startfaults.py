"""What a start that cannot go on says: an endpoint nobody answers at, a region AWS does not have, and the
same failure said again by a service manager's restart loop.

Why: measured before issue 45, ``copier run`` against a backend that was
down took 114 s and wrote 1,437 lines (the KCL daemon retrying, Java stack
frames, the AWS SDK's advice to raise its connection pool) before one line
said what was wrong, and a misspelt region took 52 s. Under systemd's
``Restart=always`` every 5 s, that is thousands of lines a minute for one
cause. So the checks before the daemon starts say it in one line that names
the endpoint, the region and where they come from, and ends with the
question a person would ask ("is the local backend running?"); and when a
service manager starts copier again and again on the same cause, only the
first start says it in full (:func:`repeat`).

Pure: the probing (``copier.adapters.reach``), the partitions
(``copier.adapters.awsauth``) and the record of the last failure
(``copier.adapters.startlog``) are the callers'.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["FULL_EVERY_MS", "SHORT_CHARS", "Repeat", "region_note", "repeat", "unreachable_text"]

FULL_EVERY_MS = 10 * 60_000  # a failure repeated for this long is said in full again (a journal read "since 10m")
SHORT_CHARS = 120  # a repeat quotes this much of the failure


def region_note(region: str, listed: Collection[str]) -> str | None:
    """What to say of a region botocore's partitions do not list by name (None when they do): a misspelling
    (with the listed region it is closest to), or a region newer than this botocore."""
    if region in listed:
        return None
    distances = {name: _edits(region, name) for name in listed}
    least = min(distances.values(), default=3)
    close = sorted(name for name, d in distances.items() if d == least and d <= 2)
    if 0 < len(close) <= 2:  # many alike: more likely a region newer than botocore
        return f"{region} is not a region this botocore lists; did you mean {' or '.join(close)}?"
    return f"{region} is not a region this botocore lists (nor would a region newer than it be)"


def unreachable_text(
    what: str, url: str, region: str, source: str, kind: str, detail: str, note: str | None = None
) -> str:
    """One line for an endpoint that did not answer: what was called, where (``url``, ``region``, and
    ``source``: the key that names the endpoint, or "AWS's endpoint for the region"), what happened (``kind``:
    refused, dns, timeout, or error with ``detail``) and the question to ask. ``note``: :func:`region_note`."""
    parts = urlsplit(url)
    host = parts.hostname or url
    port = parts.port or (443 if parts.scheme == "https" else 80)
    local = host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")
    aws = source.startswith("AWS")
    if kind == "refused":
        happened = "connection refused"
        ask = (
            f"is the local backend running (copier local-backend --port {port})?"
            if local
            else f"is the service at {host}:{port} running, and is that its port?"
        )
    elif kind == "dns":
        happened = f"the name {host} does not resolve"
        if note is not None:
            ask = f"is regionName right? {note}"
        elif aws:
            ask = "does this host have DNS and a route to AWS (a NAT gateway or a VPC endpoint)?"
        else:
            ask = "is the endpoint spelt right, and does this host have DNS?"
    elif kind == "timeout":
        happened = f"no answer within {detail}"
        ask = "is a firewall, a security group or a missing route (NAT gateway, VPC endpoint) in the way?"
    else:
        happened = detail
        ask = "does this host have a route to it?"
    return f"cannot reach {what} at {url} (region {region}, {source}): {happened}: {ask}"


def _edits(a: str, b: str) -> int:
    """Levenshtein distance: the letters to add, drop or change to make ``a`` into ``b``."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


@dataclass(frozen=True)
class Repeat:
    """What a failed start says: the cause in full (``full``, with ``text`` added to its last line) or one
    short line (``text``); ``record`` is what to keep for the next start."""

    full: bool
    text: str
    record: dict[str, object]


def _clock(ms: int) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(ms / 1000))


def repeat(previous: dict[str, object] | None, cause: str, now_ms: int) -> Repeat:
    """What a start that failed on ``cause`` (its lines, joined) says, given the record the last failed start
    left (``previous``; None: none, or the last start went through).

    The rule: a new cause is said in full. The same cause again is one short line naming when it was first
    said and how many starts it has failed, and is said in full again once :data:`FULL_EVERY_MS` has passed
    since it last was, so that a journal read over the last minutes still shows it whole.
    """
    if previous is None or previous.get("cause") != cause:
        return Repeat(True, "", {"cause": cause, "first_ms": now_ms, "starts": 1, "said_ms": now_ms})
    first, starts, said = (int(str(previous.get(k, 0))) for k in ("first_ms", "starts", "said_ms"))
    record: dict[str, object] = {"cause": cause, "first_ms": first, "starts": starts + 1, "said_ms": said}
    if now_ms - said >= FULL_EVERY_MS:
        record["said_ms"] = now_ms
        return Repeat(True, f" (the same since {_clock(first)}: {starts + 1} starts)", record)
    lines = cause.splitlines()
    head = lines[0] if len(lines[0]) <= SHORT_CHARS else lines[0][: SHORT_CHARS - 3] + "..."
    head += f" (and {len(lines) - 1} more lines)" if len(lines) > 1 else ""
    return Repeat(False, f"start {starts + 1} failed as the one at {_clock(first)} did: {head}", record)
