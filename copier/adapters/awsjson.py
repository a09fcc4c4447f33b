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
TLS verification botocore would do (its own client's, on the botocore path).
The rest is one POST on a kept-alive connection (``copier.adapters.httpwire``:
the whole call within a deadline, a connection the server closed never
written to), the body built by ``json`` and the answer parsed by ``json``.
Where a proxy is configured for the endpoint (:func:`usable`, botocore's own
rule), copier keeps botocore. This module imports no botocore: a record
processor on the lean path (``copier.adapters.awsauth``) makes every call
through it.

Failures become copier errors here, in the classes copier decides on:

* the server cannot hold the whole request (no connection, the deadline
  passed before copier handed its last byte to the kernel):
  :class:`Unsent`, safe to send again;
* no answer by the deadline once the whole request was handed to the
  kernel (whether or not all of it left), a 5xx, or an
  answer that cannot be read (not a JSON object, a DynamoDB CRC32 that does
  not match: :class:`Unreadable`): :class:`Unanswered`, the request may have
  applied; a PutRecords caller treats it as ambiguous and verifies, and a
  state write simply retries (its conditions make it idempotent);
* an AWS error answer: its code (botocore's rule: the part after ``#`` and
  before ``:``), through ``copier.adapters.awserrors.FATAL_CODES`` (fatal, and
  host-wide or not) or transient; a failed condition is :class:`ConditionFailed`
  for the caller to name (fenced, a conflict).

No retries of its own: copier retries, knowing which attempts are ambiguous.

``on_answer``, if given, is called with (local send time, local receive
time, ``Date`` header) of every answer, error answers included, in epoch
milliseconds: copier measures its clock against AWS with it
(``copier.core.clockcheck``) at no cost of a request.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import ssl
import urllib.request
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from copier.adapters.awsauth import sign
from copier.adapters.awserrors import FATAL_CODES
from copier.adapters.httpwire import Headers, NoAnswer, NotSent, Wire, request_head
from copier.core import fastjson
from copier.core.errors import AwsError, FatalAwsError, TransientAwsError

__all__ = [
    "DECODING_ERRORS",
    "AnswerCallback",
    "ConditionFailed",
    "JsonClient",
    "Unanswered",
    "Unreadable",
    "Unsent",
    "ca_bundle",
    "error_code",
    "reading",
    "usable",
]

_PROTOCOLS = {
    "kinesis": ("Kinesis_20131202", "application/x-amz-json-1.1"),
    "dynamodb": ("DynamoDB_20120810", "application/x-amz-json-1.0"),
}
AnswerCallback = Callable[[int, int, str], None]  # (sent_ms, received_ms, Date header or "")
#: What decoding a malformed answer raises (a field missing or of another type, bad base64, bad JSON).
DECODING_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError)
T = TypeVar("T")


class Unsent(TransientAwsError):
    """Nothing of the request can have been processed: no connection, or its last byte was never handed to the
    kernel (and the socket was reset, so nothing more of it leaves)."""


class Unanswered(TransientAwsError):
    """The request was sent and no usable answer came (a timeout, a dropped connection, a 5xx): it may have
    applied."""


class Unreadable(Unanswered):
    """An answer came that cannot be read (not a JSON object, a field missing, a checksum that does not match):
    what it says is unknown, so the request may have applied."""


class ConditionFailed(AwsError):
    """A conditional write's condition did not hold (DynamoDB's ConditionalCheckFailedException)."""


class CredentialSource(Protocol):
    """botocore's credentials, or ``copier.adapters.awsauth``'s: current ones, refreshed when due."""

    def get_frozen_credentials(self) -> Any: ...


def reading(operation: str, decode: Callable[..., T], *answer: Any) -> T:
    """``decode(*answer)``, the turning of an answer into copier's values; a malformed answer (any of
    :data:`DECODING_ERRORS`) as :class:`Unreadable`, never a plain Python exception."""
    try:
        return decode(*answer)
    except DECODING_ERRORS as exc:
        raise Unreadable(operation, "UnreadableAnswer", f"the answer cannot be read: {exc!r}"[:300]) from exc


def ca_bundle(environ: Mapping[str, str] = os.environ) -> str | None:
    """The CA bundle botocore would verify with where no config file applies (the lean path):
    ``AWS_CA_BUNDLE``, else ``REQUESTS_CA_BUNDLE``, else certifi's, else botocore's own."""
    for name in ("AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE"):
        if environ.get(name, "").strip():
            return environ[name]
    try:
        import certifi
    except ImportError:
        spec = importlib.util.find_spec("botocore")
        if spec is None or not spec.submodule_search_locations:
            return None
        return str(Path(next(iter(spec.submodule_search_locations))) / "cacert.pem")
    return str(certifi.where())


def usable(endpoint_url: str) -> bool:
    """False when a proxy applies to this endpoint: then copier keeps botocore, which handles proxies.

    botocore's rule (``botocore.utils.should_bypass_proxies``): the environment's proxy for the URL's scheme,
    unless ``NO_PROXY`` matches the URL's network location, host and port (``host:port`` entries match).
    """
    parts = urlsplit(endpoint_url)
    if parts.scheme not in urllib.request.getproxies():
        return True
    try:
        return bool(urllib.request.proxy_bypass(parts.netloc))
    except (TypeError, socket.gaierror):  # botocore ignores these too, and uses the proxy
        return False


def _tls_of_botocore(botocore_client: Any) -> ssl.SSLContext | None:
    """The verification botocore's own client does (config file ``ca_bundle``, ``AWS_CA_BUNDLE``,
    ``REQUESTS_CA_BUNDLE``, ``verify=``, a client certificate), taken from the client itself, not derived again.

    None when the client does not show it (a botocore whose insides changed): the caller then keeps botocore.
    """
    try:
        http = botocore_client._endpoint.http_session
        verify, cert, key = http._verify, http._cert_file, http._key_file
    except AttributeError:
        return None
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        from botocore.httpsession import get_cert_path

        context = ssl.create_default_context(cafile=get_cert_path(verify))
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


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
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``connect_timeout``, ``read_timeout``: the bounds of a call given no deadline (:meth:`call`).
        ``tls``: how to verify the server (default: :func:`ca_bundle`)."""
        self.service, self.region = service, region
        self.url = url.rstrip("/") + "/"
        parts = urlsplit(self.url)
        https = parts.scheme == "https"
        if https and tls is None:
            tls = ssl.create_default_context(cafile=ca_bundle())
        self.credentials = credentials  # botocore's or copier.adapters.awsauth's: refresh themselves
        self.target, self.content_type = _PROTOCOLS[self.service]
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        port = parts.port or (443 if https else 80)
        self.wire = Wire(parts.hostname or "", port, tls if https else None, connect_timeout)
        self.on_answer = on_answer

    @classmethod
    def for_botocore(
        cls,
        botocore_client: Any,
        credentials: CredentialSource,
        connect_timeout: float,
        read_timeout: float,
        on_answer: AnswerCallback | None = None,
    ) -> JsonClient | None:
        """A client for the service, region, endpoint and TLS verification a botocore client resolved; None
        when the botocore client does not show how it verifies TLS (then botocore makes the calls)."""
        meta = botocore_client.meta
        service = meta.service_model.endpoint_prefix
        url = meta.endpoint_url
        tls = None
        if url.startswith("https"):
            tls = _tls_of_botocore(botocore_client)
            if tls is None:
                return None
        return cls(service, meta.region_name, url, credentials, connect_timeout, read_timeout, on_answer, tls)

    def close(self) -> None:
        self.wire.close()

    def call(self, operation: str, body: bytes, deadline: float | None = None) -> dict[str, Any]:
        """One signed POST of a JSON body, its whole life by ``deadline`` (``time.monotonic()``; None: a new
        connection within the connect timeout, then the read timeout for sending and the answer); the answer as
        a JSON object, or a copier error (module docstring).

        The credentials (a refresh may take seconds) come first: when they leave no time, nothing is sent.
        """
        credentials = self.credentials.get_frozen_credentials()
        target = {"X-Amz-Target": f"{self.target}.{operation}", "Content-Type": self.content_type}
        try:
            head = request_head(sign(credentials, self.service, self.region, self.url, target, body), len(body))
        except ValueError as exc:  # a header that cannot be sent (credentials with a line break): nothing sent
            raise Unsent(operation, "InvalidHeader", str(exc)) from exc
        try:
            answer = self.wire.exchange(head, body, deadline, self.read_timeout)
        except NotSent as exc:
            raise Unsent(operation, exc.code, str(exc)) from exc
        except NoAnswer as exc:
            raise Unanswered(operation, exc.code, str(exc)) from exc
        if self.on_answer is not None:
            self.on_answer(answer.sent_ms, answer.received_ms, answer.headers.get("Date") or "")
        _check_crc32(operation, answer.headers, answer.body)
        if answer.status == 200:
            doc = _json_object(answer.body)
            if doc is None:
                raise Unreadable(operation, "UnreadableAnswer", f"HTTP 200, not a JSON object: {answer.body[:120]!r}")
            return doc
        raise _error(operation, answer.status, answer.headers, answer.body)


def _json_object(data: bytes) -> dict[str, Any] | None:
    """``data`` as a JSON object, None when it is not one (not JSON, not UTF-8, another JSON value)."""
    try:
        doc = fastjson.loads(data)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _check_crc32(operation: str, headers: Headers, data: bytes) -> None:
    """DynamoDB's ``x-amz-crc32`` of the body, checked as botocore does: a mismatch (or a value that is no
    number) means the answer was damaged on the way; what it said is unknown (:class:`Unreadable`)."""
    expected = headers.get("x-amz-crc32")
    if expected is None:
        return
    actual = zlib.crc32(data) & 0xFFFFFFFF
    if not expected.strip().isdigit() or int(expected) != actual:
        raise Unreadable(operation, "CRC32Mismatch", f"x-amz-crc32 {expected!r}, the body's is {actual}")


def error_code(raw: str, status: int) -> str:
    """An AWS JSON error type as botocore reads it: ``aws.protocol#Code:detail`` -> ``Code``."""
    code = raw.split(":", 1)[0].rpartition("#")[2].strip()
    return code or f"HTTP{status}"


def _error(operation: str, status: int, headers: Headers, data: bytes) -> AwsError:
    doc = _json_object(data) or {}
    kind = doc.get("__type")
    raw = kind if isinstance(kind, str) else headers.get("x-amzn-ErrorType") or ""
    code = error_code(raw, status)
    text = doc.get("message") or doc.get("Message")
    message = text if isinstance(text, str) else repr(data[:200])
    if status >= 500 or status < 400:
        # A 5xx, or an answer that is neither a success nor a refusal (a 1xx, a 2xx other than 200, a 3xx: a
        # proxy's, never AWS's): nothing says the request was not carried out. A put's outcome is unknown
        # (verified, never resent blindly); a definite failure here could make a resend a duplicate.
        return Unanswered(operation, code, message)
    if code == "ConditionalCheckFailedException":
        return ConditionFailed(operation, code, message)
    if code in FATAL_CODES:
        return FatalAwsError(operation, code, message)
    return TransientAwsError(operation, code, message)
