"""The Kinesis reads of a record processor over the lean JSON client, answering as botocore's client does.

``copier.adapters.kinesis.KinesisStreams`` reads the staging stream (its
shards, its settings, a range read again) and the target side (what a put
left there) through a client with botocore's method names; this is that
client without botocore (``copier.adapters.awsauth``): the same calls, the
answers in the shape botocore's parser gives them (record data as bytes), and
what botocore's standard retry mode retries (no connection, no answer, a 5xx,
throttling, an answer that cannot be read: :func:`_retried`) retried a few
times with backoff (a read cannot duplicate anything); any other error
answer, an expired iterator among them, goes to the caller at once.
DescribeStreamSummary is made once: its 20 calls a second are the
account's, a throttled one retried at once only spends more of them, and
its caller goes on with the last answer it has and asks again later
(``copier.core.summaryage``: ``SUMMARY_RETRY_S``). Every
answer is checked for the fields copier reads before it is returned
(``copier.adapters.kinesisanswers``). Puts do not come here:
``KinesisStreams`` sends them itself, exactly once each.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from copier.adapters.awserrors import RETRIED_CODES
from copier.adapters.awsjson import JsonClient, Unanswered, Unsent, reading
from copier.adapters.kinesisanswers import records_page, shard_iterator, shards_page, stream_summary
from copier.core import fastjson
from copier.core.errors import AwsError

__all__ = ["LeanKinesis"]

READ_ATTEMPTS = 3
SUMMARY_ATTEMPTS = 1  # DescribeStreamSummary: see the module docstring


def _retried(error: AwsError) -> bool:
    """Whether botocore's standard retry mode would send this request again."""
    return isinstance(error, (Unsent, Unanswered)) or error.code in RETRIED_CODES


class LeanKinesis:
    """ListShards, DescribeStreamSummary, GetShardIterator and GetRecords with botocore's signatures."""

    def __init__(self, client: JsonClient, sleep: Callable[[float], None] = time.sleep) -> None:
        self.client = client
        self._sleep = sleep

    def _call(
        self,
        operation: str,
        params: dict[str, Any],
        check: Callable[[dict[str, Any]], dict[str, Any]],
        attempts: int = READ_ATTEMPTS,
    ) -> dict[str, Any]:
        body = fastjson.dumps(params)
        for attempt in range(attempts):
            try:
                return reading(operation, check, self.client.call(operation, body))
            except AwsError as exc:
                if attempt == attempts - 1 or not _retried(exc):
                    raise
                self._sleep(random.uniform(0, 0.1 * 2**attempt))  # noqa: S311 - jitter, not secrecy
        raise AssertionError("unreachable")

    def list_shards(self, **params: Any) -> dict[str, Any]:
        return self._call("ListShards", params, shards_page)

    def describe_stream_summary(self, **params: Any) -> dict[str, Any]:
        return self._call("DescribeStreamSummary", params, stream_summary, SUMMARY_ATTEMPTS)

    def get_shard_iterator(self, **params: Any) -> dict[str, Any]:
        return self._call("GetShardIterator", params, shard_iterator)

    def get_records(self, **params: Any) -> dict[str, Any]:
        """GetRecords; each record's ``Data`` decoded from base64 to bytes, as botocore gives it."""
        return self._call("GetRecords", params, records_page)
