"""A lean client for the AWS JSON-protocol calls on copier's hot path: PutRecords and the state table writes.

Why not botocore for these: measured on this project's CI machine, botocore
spends about 2.5 ms of CPU on every call (event hooks, endpoint rules, the
user agent, request objects) and about 15 µs per PutRecords entry on
validating and serialising it. A shard at its write limit makes a few
PutRecords and two state writes a second, for every shard on the host; at
small batches that overhead alone exceeds everything else copier does
(docs/benchmarks.md). This client keeps what botocore does well and cannot
be skipped: the endpoint botocore resolves for the region (partitions, FIPS,
custom endpoints), credentials that refresh themselves (instance profiles,
assumed roles), and SigV4 signing (``botocore.auth.SigV4Auth``). The rest is
one POST through urllib3 (botocore's own HTTP library) with the body built
by ``json``, and the answer parsed by ``json``.

Failures become copier errors here, in the classes copier decides on:

* the connection could not be made (nothing was sent): ``TransientAwsError``;
* no answer, or a 5xx (the request may have been applied): :class:`Unanswered`,
  which a PutRecords caller treats as ambiguous and verifies, and a state
  write simply retries (its conditions make it idempotent);
* an AWS error answer: its code, through ``copier.aws.FATAL_CODES`` (fatal,
  and host-wide or not) or transient; a failed condition is
  :class:`ConditionFailed` for the caller to name (fenced, a conflict).

No retries of its own: copier retries, knowing which attempts are ambiguous.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

from copier.aws import FATAL_CODES
from copier.errors import AwsError, FatalAwsError, TransientAwsError

__all__ = ["ConditionFailed", "JsonClient", "Unanswered"]

_PROTOCOLS = {
    "kinesis": ("Kinesis_20131202", "application/x-amz-json-1.1"),
    "dynamodb": ("DynamoDB_20120810", "application/x-amz-json-1.0"),
}


class Unanswered(TransientAwsError):
    """The request was sent and no answer came (a timeout, a dropped connection, a 5xx): it may have applied."""


class ConditionFailed(AwsError):
    """A conditional write's condition did not hold (DynamoDB's ConditionalCheckFailedException)."""


class JsonClient:
    """Signs and sends JSON-protocol requests for one service; see the module docstring."""

    def __init__(self, botocore_client: Any, credentials: Any, connect_timeout: float, read_timeout: float) -> None:
        meta = botocore_client.meta
        self.service = meta.service_model.endpoint_prefix
        self.region = meta.region_name
        self.url = meta.endpoint_url.rstrip("/") + "/"
        self.credentials = credentials  # botocore's: refreshes itself when it expires
        self.target, self.content_type = _PROTOCOLS[self.service]
        self.pool = urllib3.PoolManager(
            maxsize=4, retries=False, timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout)
        )

    def call(self, operation: str, body: bytes) -> dict[str, Any]:
        """One signed POST of a JSON body; the parsed answer, or a copier error (see the module docstring)."""
        request = AWSRequest(
            method="POST",
            url=self.url,
            data=body,
            headers={"X-Amz-Target": f"{self.target}.{operation}", "Content-Type": self.content_type},
        )
        SigV4Auth(self.credentials.get_frozen_credentials(), self.service, self.region).add_auth(request)
        try:
            answer = self.pool.request("POST", self.url, body=body, headers=dict(request.headers.items()))
        except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError) as exc:
            raise TransientAwsError(operation, type(exc).__name__, str(exc)) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise Unanswered(operation, type(exc).__name__, str(exc)) from exc
        if answer.status == 200:
            parsed: dict[str, Any] = json.loads(answer.data)
            return parsed
        raise _error(operation, answer.status, answer.data)


def _error(operation: str, status: int, data: bytes) -> AwsError:
    try:
        doc = json.loads(data)
    except ValueError:
        doc = {}
    code = str(doc.get("__type", f"HTTP{status}")).rpartition("#")[2]
    message = str(doc.get("message") or doc.get("Message") or data[:200])
    if status >= 500:
        return Unanswered(operation, code, message)
    if code == "ConditionalCheckFailedException":
        return ConditionFailed(operation, code, message)
    if code in FATAL_CODES:
        return FatalAwsError(operation, code, message)
    return TransientAwsError(operation, code, message)
