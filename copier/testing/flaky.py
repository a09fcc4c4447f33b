"""FlakyKinesis: fault injection for the Spark staging writer, around a real boto3 client.

moto never throttles, so this is how tests reach the writer's retry path.
It is picklable and keeps its call counts per process, because Spark runs
the writer's tasks in worker processes of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

__all__ = ["FlakyKinesis", "flaky_kinesis", "read_flaky_log"]

# PutRecords calls seen by FlakyKinesis in this process, per key. Spark runs tasks in several Python
# worker processes and reuses them between jobs, so the schedule is per process and keyed by test.
_FLAKY_CALLS: Counter[str] = Counter()


class FlakyKinesis:
    """A Kinesis client that makes chosen PutRecords entries fail, around a real boto3 client.

    moto never throttles, so this is how tests reach the writer's retry path.
    Per process and ``key``: the first ``request_failures`` PutRecords calls
    fail as a whole (a 503 ``ServiceUnavailable``, nothing sent); the next
    ``fail_calls`` calls fail the entries at positions 0, ``every``, 2 *
    ``every``, ... with ``error_codes`` in turn (those entries are not sent,
    as Kinesis does not store failed entries); later calls pass through.
    With ``log_path``, every call appends a JSON line (pid, call number,
    entries, injected failures by code) so a test can count calls across
    Spark's worker processes. Picklable: the real client is built lazily from
    the writer settings, in the process that uses it.
    """

    def __init__(
        self,
        settings: Any,
        *,
        key: str = "default",
        fail_calls: int = 3,
        every: int = 2,
        error_codes: Sequence[str] = ("ProvisionedThroughputExceededException", "InternalFailure"),
        request_failures: int = 0,
        log_path: str | None = None,
    ) -> None:
        if every < 1 or not error_codes:
            raise ValueError("every must be >= 1 and error_codes non-empty")
        self.settings = settings
        self.key = key
        self.fail_calls = fail_calls
        self.every = every
        self.error_codes = tuple(error_codes)
        self.request_failures = request_failures
        self.log_path = log_path
        self._real: Any = None

    @property
    def client(self) -> Any:
        if self._real is None:
            from copier.spark import default_client

            self._real = default_client(self.settings)
        return self._real

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_real": None}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.client, name)  # list_shards, get_records, ...: the real client's

    def _log(self, **line: Any) -> None:
        if self.log_path is not None:
            import json
            import os

            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"pid": os.getpid(), "key": self.key, **line}) + "\n")

    def put_records(self, *, StreamName: str, Records: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:  # noqa: N803
        call = _FLAKY_CALLS[self.key]
        _FLAKY_CALLS[self.key] += 1
        if call < self.request_failures:
            import botocore.exceptions

            self._log(call=call, entries=len(Records), injected={"ServiceUnavailable": len(Records)}, request=True)
            raise botocore.exceptions.ClientError(
                {
                    "Error": {"Code": "ServiceUnavailable", "Message": "injected by FlakyKinesis"},
                    "ResponseMetadata": {"HTTPStatusCode": 503},
                },
                "PutRecords",
            )
        failed: dict[int, str] = {}
        if call < self.request_failures + self.fail_calls:
            codes = self.error_codes
            failed = {i: codes[n % len(codes)] for n, i in enumerate(range(0, len(Records), self.every))}
        send = [r for i, r in enumerate(Records) if i not in failed]
        answer = self.client.put_records(StreamName=StreamName, Records=send, **kwargs) if send else {"Records": []}
        landed = iter(answer["Records"])
        results = [
            {"ErrorCode": failed[i], "ErrorMessage": "injected by FlakyKinesis"} if i in failed else next(landed)
            for i in range(len(Records))
        ]
        self._log(call=call, entries=len(Records), injected=dict(Counter(failed.values())), request=False)
        return {"FailedRecordCount": sum(1 for r in results if r.get("ErrorCode")), "Records": results}


def flaky_kinesis(settings: Any, **options: Any) -> FlakyKinesis:
    """A ``WriterSettings.client_factory``: ``functools.partial(flaky_kinesis, key=..., fail_calls=...)``."""
    return FlakyKinesis(settings, **options)


def read_flaky_log(path: str) -> list[dict[str, Any]]:
    """The calls FlakyKinesis logged to ``path``, in every process."""
    import json

    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
