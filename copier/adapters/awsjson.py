"""A lean client for the AWS JSON-protocol calls on copier's hot path: PutRecords and the state table writes.

Why not botocore for these: measured on this project's CI machine, botocore
spends about 2.5 ms of CPU on every call (event hooks, endpoint rules, the
user agent, request objects) and about 15 µs per PutRecords entry on
validating and serialising it. A shard at its write limit makes a few
PutRecords and two state writes a second, for every shard on the host; at
small batches that overhead alone exceeds everything else copier does
(docs/benchmarks.md). This client keeps what botocore does well and cannot
be skipped: the endpoint (botocore's where botocore is used, else
``copier.adapters.awsauth``'s), credentials that refresh themselves, SigV4
signing (``copier.adapters.awsauth.sign``, checked against botocore's) and the
CA bundle botocore would use. The rest is one POST on a kept-alive
``http.client`` connection with the body built by ``json``, and the answer
parsed by ``json``. Where a proxy is configured for the endpoint
(:func:`usable`), copier keeps botocore. This module imports no botocore: a
record processor on the lean path (``copier.adapters.awsauth``) makes every
call through it.

Failures become copier errors here, in the classes copier decides on:

* the connection could not be made (nothing was sent): :class:`Unsent`;
* no answer, or a 5xx (the request may have been applied): :class:`Unanswered`,
  which a PutRecords caller treats as ambiguous and verifies, and a state
  write simply retries (its conditions make it idempotent);
* an AWS error answer: its code, through ``copier.adapters.aws.FATAL_CODES`` (fatal,
  and host-wide or not) or transient; a failed condition is
  :class:`ConditionFailed` for the caller to name (fenced, a conflict).

No retries of its own: copier retries, knowing which attempts are ambiguous.

``on_answer``, if given, is called with (local send time, local receive
time, ``Date`` header) of every answer, error answers included, in epoch
milliseconds: copier measures its clock against AWS with it
(``copier.core.clockcheck``) at no cost of a request.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import socket
import ssl
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from copier.adapters.awsauth import sign
from copier.adapters.awserrors import FATAL_CODES
from copier.core.errors import AwsError, FatalAwsError, TransientAwsError

__all__ = ["AnswerCallback", "ConditionFailed", "JsonClient", "Unanswered", "Unsent", "ca_bundle", "usable"]

_PROTOCOLS = {
    "kinesis": ("Kinesis_20131202", "application/x-amz-json-1.1"),
    "dynamodb": ("DynamoDB_20120810", "application/x-amz-json-1.0"),
}
IDLE_RECONNECT_S = 20.0  # servers close idle connections (AWS after about a minute): never send on a stale one
_NOT_SENT = (ConnectionRefusedError, socket.gaierror, http.client.NotConnected)
AnswerCallback = Callable[[int, int, str], None]  # (sent_ms, received_ms, Date header or "")


class Unsent(TransientAwsError):
    """Nothing was sent: the connection could not be made (refused, no such host, a connect timeout)."""


class Unanswered(TransientAwsError):
    """The request was sent and no answer came (a timeout, a dropped connection, a 5xx): it may have applied."""


class ConditionFailed(AwsError):
    """A conditional write's condition did not hold (DynamoDB's ConditionalCheckFailedException)."""


class CredentialSource(Protocol):
    """botocore's credentials, or ``copier.adapters.awsauth``'s: current ones, refreshed when due."""

    def get_frozen_credentials(self) -> Any: ...


def ca_bundle() -> str | None:
    """The CA bundle botocore would verify with: ``AWS_CA_BUNDLE``, else certifi's, else botocore's own."""
    if os.environ.get("AWS_CA_BUNDLE"):
        return os.environ["AWS_CA_BUNDLE"]
    try:
        import certifi
    except ImportError:
        spec = importlib.util.find_spec("botocore")
        if spec is None or not spec.submodule_search_locations:
            return None
        return str(Path(next(iter(spec.submodule_search_locations))) / "cacert.pem")
    return str(certifi.where())


def usable(endpoint_url: str) -> bool:
    """False when a proxy is configured for this endpoint: then copier keeps botocore, which handles proxies."""
    parts = urlsplit(endpoint_url)
    proxies = urllib.request.getproxies()
    return parts.scheme not in proxies or bool(urllib.request.proxy_bypass(parts.hostname or ""))


class JsonClient:
    """Signs and sends JSON-protocol requests for one service on one keep-alive connection; see the module docstring.

    Not thread-safe: a record processor makes one call at a time.
    """

    def __init__(
        self,
        service: str,
        region: str,
        url: str,
        credentials: CredentialSource,
        connect_timeout: float,
        read_timeout: float,
        on_answer: AnswerCallback | None = None,
    ) -> None:
        self.service, self.region = service, region
        self.url = url.rstrip("/") + "/"
        parts = urlsplit(self.url)
        self.host, self.https = parts.hostname or "", parts.scheme == "https"
        self.port = parts.port or (443 if self.https else 80)
        self.credentials = credentials  # botocore's or copier.adapters.awsauth's: refresh themselves
        self.target, self.content_type = _PROTOCOLS[self.service]
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self._connection: http.client.HTTPConnection | None = None
        self._last_used = 0.0
        self._tls: ssl.SSLContext | None = None
        self.on_answer = on_answer

    @classmethod
    def for_botocore(
        cls,
        botocore_client: Any,
        credentials: CredentialSource,
        connect_timeout: float,
        read_timeout: float,
        on_answer: AnswerCallback | None = None,
    ) -> JsonClient:
        """A client for the service, region and endpoint a botocore client resolved."""
        meta = botocore_client.meta
        service = meta.service_model.endpoint_prefix
        return cls(service, meta.region_name, meta.endpoint_url, credentials, connect_timeout, read_timeout, on_answer)

    def _connect(self) -> http.client.HTTPConnection:
        """The kept-alive connection, or a new one with the read timeout on its socket.

        A connection the server closed (an answer with ``Connection: close``)
        has no socket: it is replaced here, never reopened by http.client's
        ``auto_open``, which would wait for every answer on it with the
        connect timeout instead of the read timeout.
        """
        live = self._connection is not None and self._connection.sock is not None
        if live and time.monotonic() - self._last_used < IDLE_RECONNECT_S:
            assert self._connection is not None
            return self._connection
        self.close()
        if self.https:
            if self._tls is None:
                self._tls = ssl.create_default_context(cafile=ca_bundle())
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.host, self.port, timeout=self.connect_timeout, context=self._tls
            )
        else:
            connection = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout)
        connection.auto_open = 0  # see above: a closed connection raises NotConnected, nothing sent
        connection.connect()  # nothing is sent if this fails
        assert connection.sock is not None
        connection.sock.settimeout(self.read_timeout)
        self._connection = connection
        return connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def call(self, operation: str, body: bytes) -> dict[str, Any]:
        """One signed POST of a JSON body; the parsed answer, or a copier error (see the module docstring)."""
        headers = sign(
            self.credentials.get_frozen_credentials(),
            self.service,
            self.region,
            self.url,
            {"X-Amz-Target": f"{self.target}.{operation}", "Content-Type": self.content_type},
            body,
        )
        try:
            connection = self._connect()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise Unsent(operation, type(exc).__name__, str(exc)) from exc
        try:
            sent_ms = time.time_ns() // 1_000_000
            connection.request("POST", "/", body=body, headers=headers)
            answer = connection.getresponse()
            received_ms = time.time_ns() // 1_000_000
            data = answer.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            if isinstance(exc, _NOT_SENT):
                raise Unsent(operation, type(exc).__name__, str(exc)) from exc
            raise Unanswered(operation, type(exc).__name__, str(exc)) from exc
        self._last_used = time.monotonic()
        if self.on_answer is not None:
            self.on_answer(sent_ms, received_ms, answer.getheader("Date") or "")
        if answer.status == 200:
            parsed: dict[str, Any] = json.loads(data)
            return parsed
        raise _error(operation, answer.status, data)


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
