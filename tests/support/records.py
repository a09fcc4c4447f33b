"""What must become of each record the daemon hands a processor: forwarded or dead-lettered, exactly once.

Shared by the in-process property test (``tests/test_record_path.py``) and the
same check through ``copier process`` (``tests/test_protocol.py``).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Sequence

from copier.core.plan import replacement_key
from copier.local.multilang import Rec


def kinesis_takes(key: str) -> bool:
    """Kinesis' rule for a partition key, written out apart from copier's: 1 to 256 code points, Unicode text."""
    return 1 <= len(key) <= 256 and not any(0xD800 <= ord(c) <= 0xDFFF for c in key)


def check_outcome(delivered: Sequence[Rec], target: Iterable[tuple[str, bytes]], dead_letters: Iterable[bytes]) -> None:
    """Every delivered record is in the target (under its own key when Kinesis takes it, else the replacement
    key) or in the dead-letter stream (an envelope naming its position, key and bytes), each exactly once, and
    nothing else is in either."""
    by_position = {(r.seq, r.subseq): r for r in delivered}
    assert len(by_position) == len(delivered)
    lettered: set[tuple[int, int]] = set()
    for envelope in dead_letters:
        body = json.loads(envelope)
        position = (int(body["sequenceNumber"]), int(body["subSequenceNumber"]))
        record = by_position[position]
        assert position not in lettered, f"dead-lettered twice: {position}"
        lettered.add(position)
        assert body["partitionKey"] == record.partition_key and body["reason"]
        if body["data"] is None:
            assert body["dataSha256"] == hashlib.sha256(record.data).hexdigest()
        else:
            assert base64.b64decode(body["data"]) == record.data
    expected = Counter(
        (r.partition_key if kinesis_takes(r.partition_key) else replacement_key(r.partition_key), r.data)
        for r in delivered
        if (r.seq, r.subseq) not in lettered
    )
    landed = Counter(target)
    assert landed == expected
    assert all(kinesis_takes(pk) for pk, _ in landed)
