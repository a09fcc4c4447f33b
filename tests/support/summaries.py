"""What the DescribeStreamSummary tests share: the keys the lean path signs with, a stream's summary and
AWS's throttling answer as the fake endpoint sends them, and the count of DescribeStreamSummary calls it
received (tests/test_control_plane_budget.py, tests/test_summary_board.py)."""

from __future__ import annotations

from copier.adapters.awsauth import Credentials
from copier.core.streamsettings import StreamSettings
from tests.support.fakeaws import FakeAws

KEYS = Credentials("AKIDEXAMPLE", "secret")
SUMMARY = {"StreamDescriptionSummary": {"RetentionPeriodHours": 24, "MaxRecordSizeInKiB": 2048, "OpenShardCount": 1}}
THROTTLED = {"__type": "LimitExceededException", "message": "Rate exceeded for stream"}
SETTINGS = StreamSettings("target", max_record_bytes=2048 * 1024)  # what SUMMARY says of the target's limit


def described(fake: FakeAws) -> int:
    """The DescribeStreamSummary calls ``fake`` received."""
    return sum(1 for r in fake.received if r.headers.get("X-Amz-Target", "").endswith("DescribeStreamSummary"))
