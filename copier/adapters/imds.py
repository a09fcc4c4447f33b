"""The instance profile's credentials from the instance metadata service (IMDS), as botocore gets them, minus its
storms: the lean path's link of botocore's default chain (``copier.adapters.awsauth``).

As botocore 1.44 does (``botocore.utils.InstanceMetadataFetcher``, ``RefreshableCredentials``):

* the endpoint: ``AWS_EC2_METADATA_SERVICE_ENDPOINT``, else the IPv6 one
  where ``AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE`` is ``ipv6`` (or, without a
  mode, ``AWS_IMDS_USE_IPV6`` is true), else the IPv4 one; an endpoint or a
  mode botocore refuses is refused here, with a message naming the setting
  (:func:`imds_settings`, a ConfigError);
* an IMDSv2 token first; IMDSv1 where the token request is refused (403,
  404, 405) or unanswered, unless ``AWS_EC2_METADATA_V1_DISABLED`` is true;
* one attempt per request, each socket operation waited for at most
  botocore's ``metadata_service_timeout`` (1 s): a service that takes the
  requests and never answers stalls a refresh 2 s (the token, then the
  role over IMDSv1), as it stalls botocore's;
* an answer without the four credential fields (an error document, an
  empty role list, not JSON) is a failed refresh, never a Python exception;
* refreshed when under 15 minutes are left, and credentials handed out with
  less than that plus a random 2 to 10 minutes left, or already expired (the
  service keeps handing out the last ones while the credential service is
  down), count as expiring that long after now: the next refresh comes 2 to
  10 minutes later, not at the next signing.

Where botocore goes on asking on every call, copier backs off: a failed
refresh is remembered and the next one waits 1 s, doubling to 60 s (with
jitter). Meanwhile the credentials in hand are used while they have more
than 10 minutes left (botocore raises on every call even then); under that,
or with none, a call fails at once with a TransientAwsError, which the
caller retries, without a request to the service.
"""

from __future__ import annotations

import datetime as dt
import http.client
import ipaddress
import json
import random
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from copier.adapters.awsauth import Credentials
from copier.core.errors import ConfigError, TransientAwsError

__all__ = ["ImdsCredentials", "ImdsSettings", "imds_settings"]

REFRESH_BEFORE_S = 15 * 60  # botocore's advisory refresh window, and its chain's ec2_credential_refresh_window
MANDATORY_BEFORE_S = 10 * 60  # within this, credentials that could not be refreshed are not used
EXTENSION_JITTER_S = (120, 600)  # botocore's random addition to the refresh window for near-expiry credentials
IMDS_DEFAULT = "http://169.254.169.254/"
IMDS_IPV6 = "http://[fd00:ec2::254]/"
IMDS_TOKEN_TTL_S = 21_600
IMDS_TIMEOUT_S = 1.0  # botocore's metadata_service_timeout
BACKOFF_S = (1.0, 60.0)  # after a failed refresh: the first wait, and the longest
_FAILURES = (OSError, http.client.HTTPException, ValueError, KeyError, TypeError, IndexError, RecursionError)
_HOST_RE = re.compile(r"^((?!-)[A-Z\d-]{1,63}(?<!-)\.)*((?!-)[A-Z\d-]{1,63}(?<!-))$", re.IGNORECASE)
_BASE = "/latest/meta-data/iam/security-credentials/"


@dataclass(frozen=True)
class ImdsSettings:
    endpoint: str
    v1_allowed: bool


def _true(value: str | None) -> bool:
    """botocore's ``ensure_boolean`` of a setting read from the environment."""
    return value is not None and value.lower() == "true"


def _valid_endpoint(url: str) -> bool:
    """botocore's ``is_valid_uri``: a host name of DNS labels (or an IPv4 address), or a bracketed IPv6 address;
    also a port that is a number (botocore fails on it at the first request)."""
    if any(c in url for c in "\t\r\n"):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        return False
    host = parts.hostname
    if not host:
        return False
    if "[" in parts.netloc:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return False
        return True
    host = host[:-1] if host.endswith(".") else host
    return len(host) <= 255 and _HOST_RE.match(host) is not None


def imds_settings(environ: Mapping[str, str]) -> ImdsSettings:
    """The service's endpoint and whether IMDSv1 may be used, from the environment as botocore reads it;
    a ConfigError for a setting botocore refuses (it fails on it even where credentials are in the environment)."""
    mode = environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE")
    if mode is not None and mode.lower() not in ("ipv4", "ipv6"):
        raise ConfigError("the environment", "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", f"{mode!r} is not ipv4 or ipv6")
    ipv6 = mode.lower() == "ipv6" if mode is not None else _true(environ.get("AWS_IMDS_USE_IPV6"))
    endpoint = environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or (IMDS_IPV6 if ipv6 else IMDS_DEFAULT)
    if not _valid_endpoint(endpoint):
        raise ConfigError(
            "the environment",
            "AWS_EC2_METADATA_SERVICE_ENDPOINT",
            f"{endpoint!r} is not a URL with a valid host (botocore refuses it too)",
        )
    return ImdsSettings(endpoint, not _true(environ.get("AWS_EC2_METADATA_V1_DISABLED")))


def _expiry(text: object) -> float:
    """An ``Expiration`` as epoch seconds (ISO 8601; UTC when it names no zone)."""
    if not isinstance(text, str):
        raise ValueError(f"Expiration is {text!r}")
    when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


def _credentials(body: str) -> tuple[Credentials, float]:
    """The credentials document, all four fields required (botocore's rule); ValueError otherwise."""
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise ValueError("the credentials document is not a JSON object")
    fields = [doc.get(name) for name in ("AccessKeyId", "SecretAccessKey", "Token")]
    if not all(isinstance(f, str) and f and f.isprintable() and f.isascii() for f in fields):
        said = f": {doc.get('Code')}: {doc.get('Message')}" if "Code" in doc else ""
        raise ValueError(f"no credentials in the answer{said}")
    key, secret, token = (str(f) for f in fields)
    return Credentials(key, secret, token), _expiry(doc.get("Expiration"))


class ImdsCredentials:
    """The instance profile's credentials, fetched on first use and again before they expire (module docstring)."""

    def __init__(
        self,
        endpoint: str = IMDS_DEFAULT,
        clock: Callable[[], float] = time.time,
        timeout: float = IMDS_TIMEOUT_S,
        v1_allowed: bool = True,
        rng: random.Random | None = None,
    ) -> None:
        parts = urlsplit(endpoint)
        self._host, self._port = parts.hostname or "", parts.port or 80
        self._prefix = parts.path.rstrip("/")  # botocore appends the paths to the endpoint's own
        self._clock, self._timeout, self._v1_allowed = clock, timeout, v1_allowed
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not secrecy
        self._credentials: Credentials | None = None
        self._expires = 0.0
        self._failures = 0
        self._retry_at = 0.0
        self._last_error = ""
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: ImdsSettings) -> ImdsCredentials:
        return cls(settings.endpoint, v1_allowed=settings.v1_allowed)

    def get_frozen_credentials(self) -> Credentials:
        with self._lock:
            now = self._clock()
            left = self._expires - now
            if self._credentials is not None and left >= REFRESH_BEFORE_S:
                return self._credentials
            kept = self._credentials if left >= MANDATORY_BEFORE_S else None
            if now < self._retry_at:
                if kept is not None:
                    return kept
                what = f"the last refresh failed ({self._last_error}); the next in {self._retry_at - now:.1f} s"
                raise TransientAwsError("IMDS", "RefreshBackingOff", f"instance profile credentials: {what}")
            try:
                credentials, expires = self._fetch()
            except _FAILURES as exc:
                self._failures += 1
                wait = min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** (self._failures - 1))
                self._retry_at = now + wait * self._rng.uniform(0.5, 1.0)
                self._last_error = f"{type(exc).__name__}: {exc}"[:200]
                if kept is not None:
                    return kept
                raise TransientAwsError("IMDS", type(exc).__name__, f"instance profile credentials: {exc}") from exc
            self._failures, self._retry_at = 0, 0.0
            self._credentials, self._expires = credentials, self._extended(expires, now)
            return credentials

    def _extended(self, expires: float, now: float) -> float:
        """botocore's extension: credentials that expire within the refresh window and a random 2 to 10
        minutes count as expiring that long after now (the next refresh 2 to 10 minutes away)."""
        offset = REFRESH_BEFORE_S + self._rng.randint(*EXTENSION_JITTER_S)
        return now + offset if now >= expires - offset else expires

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        connection = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        try:
            connection.request(method, self._prefix + path, headers=headers)
            answer = connection.getresponse()
            body = answer.read().decode()
        finally:
            connection.close()
        return answer.status, body

    def _get(self, path: str, headers: dict[str, str]) -> str:
        status, body = self._request("GET", path, headers)
        if status != 200:
            raise http.client.HTTPException(f"GET {path}: HTTP {status}")
        return body

    def _token(self) -> str | None:
        """An IMDSv2 session token; None where botocore falls back to IMDSv1 (the PUT refused or unanswered)."""
        ttl = {"X-aws-ec2-metadata-token-ttl-seconds": str(IMDS_TOKEN_TTL_S)}
        try:
            status, body = self._request("PUT", "/latest/api/token", ttl)
        except TimeoutError:
            return None
        if status in (403, 404, 405):
            return None
        if status != 200:
            raise http.client.HTTPException(f"PUT /latest/api/token: HTTP {status}")
        return body or None

    def _fetch(self) -> tuple[Credentials, float]:
        token = self._token()
        if token is None and not self._v1_allowed:
            raise http.client.HTTPException("no IMDSv2 token, and IMDSv1 is disabled (AWS_EC2_METADATA_V1_DISABLED)")
        headers = {"X-aws-ec2-metadata-token": token} if token is not None else {}
        roles = self._get(_BASE, headers).split()
        if not roles:
            raise ValueError("the instance has no role (an empty role list)")
        return _credentials(self._get(_BASE + roles[0], headers))
