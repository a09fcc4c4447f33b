"""The lean path's AWS essentials without botocore: credentials, SigV4 signing, endpoints.

Why: one ``copier process`` runs per staging shard, so its memory bounds how
many shards a host holds. Importing botocore costs an idle processor about
20 MB of its RSS and each botocore client's models and endpoint rules about
14 MB more (measured: docs/benchmarks.md, "Memory per shard"); the record
processor needs none of it for the calls it makes (``copier.adapters.awsjson``).

The lean path covers how copier runs in production and in local runs:

* credentials from the environment (``AWS_ACCESS_KEY_ID``, ...), else from
  the EC2 instance profile (``copier.adapters.imds``: IMDSv2, IMDSv1 where
  allowed, refreshed before they expire, as botocore does, with a back-off
  where botocore asks again on every call), the first and the last link of
  botocore's default chain;
* endpoints from copier's properties, else AWS's standard regional endpoint
  of the region's partition (botocore's own ``partitions.json``, read as a
  file).

Anything else (a shared credentials or config file, a profile, web identity,
container credentials, an assumed target role, FIPS or dual-stack or
environment-configured endpoints, an HTTP proxy) is what botocore does well:
:func:`lean_reason` names the first such setting and the processor keeps
botocore (``copier.commands.cli``), at the memory it costs.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import importlib.util
import json
import os
import pwd
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from copier.adapters.imds import ImdsCredentials

__all__ = [
    "Credentials",
    "StaticCredentials",
    "endpoint_for",
    "host_header",
    "listed_regions",
    "lean_credentials",
    "lean_reason",
    "sign",
]

# Settings under which botocore would not do what the lean path does (see the module docstring).
_BOTOCORE_SETTINGS = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_KINESIS",
    "AWS_ENDPOINT_URL_DYNAMODB",
    "AWS_USE_FIPS_ENDPOINT",
    "AWS_USE_DUALSTACK_ENDPOINT",
    "AWS_CREDENTIAL_FILE",  # boto2's credentials file, which botocore still reads
    "AWS_CREDENTIAL_EXPIRATION",  # environment credentials botocore treats as expiring
    "AWS_ACCOUNT_ID",  # DynamoDB's account-based endpoints
    "AWS_ACCOUNT_ID_ENDPOINT_MODE",
    "AWS_METADATA_SERVICE_TIMEOUT",  # the instance profile's request timeout and attempts, as botocore reads them
    "AWS_METADATA_SERVICE_NUM_ATTEMPTS",
)


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    token: str | None = None


class StaticCredentials:
    """Credentials that do not change (the environment's)."""

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    def get_frozen_credentials(self) -> Credentials:
        return self._credentials


def lean_credentials(environ: Mapping[str, str] = os.environ) -> StaticCredentials | ImdsCredentials:
    """The environment's keys if set, else the instance profile (call :func:`lean_reason` first).

    The instance metadata settings are checked either way (a ConfigError names a bad one), as botocore
    checks them whenever it builds its default chain.
    """
    from copier.adapters.imds import ImdsCredentials, imds_settings

    settings = imds_settings(environ)
    key, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        # botocore's environment provider reads AWS_SECURITY_TOKEN before AWS_SESSION_TOKEN
        token = environ.get("AWS_SECURITY_TOKEN") or environ.get("AWS_SESSION_TOKEN") or None
        return StaticCredentials(Credentials(key, secret, token))
    return ImdsCredentials.from_settings(settings)


_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})", re.ASCII)


def _expandvars(path: str, environ: Mapping[str, str]) -> str:
    """``os.path.expandvars`` against ``environ``: ``$NAME`` and ``${NAME}`` of a set variable, others kept."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        name = name[1:-1] if name.startswith("{") else name
        return environ.get(name, match.group(0))

    return _VARIABLE.sub(value, path)


def _expanduser(path: str, environ: Mapping[str, str]) -> str:
    """``os.path.expanduser`` against ``environ``: ``~`` is HOME if set (even empty), else the password
    database's home; ``~name`` that user's; a name it does not know keeps the path as it is."""
    if not path.startswith("~"):
        return path
    end = path.find("/", 1)
    end = len(path) if end < 0 else end
    try:
        if end == 1:
            home = environ["HOME"] if "HOME" in environ else pwd.getpwuid(os.getuid()).pw_dir
        else:
            home = pwd.getpwnam(path[1:end]).pw_dir
    except KeyError:
        return path
    return (home.rstrip("/") + path[end:]) or "/"


def _config_files(environ: Mapping[str, str]) -> list[str]:
    """Every file botocore may read credentials or settings from, expanded as botocore expands them
    (``os.path.expandvars``, then ``os.path.expanduser``): a superset where it reads fewer (with BOTO_CONFIG
    set it reads neither /etc/boto.cfg nor ~/.boto)."""
    names = [
        environ.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials",
        environ.get("AWS_CONFIG_FILE") or "~/.aws/config",
        environ.get("BOTO_CONFIG") or "/etc/boto.cfg",
        "/etc/boto.cfg",
        "~/.boto",
    ]
    return [_expanduser(_expandvars(name, environ), environ) for name in dict.fromkeys(names)]


def lean_reason(
    calls: Iterable[tuple[str, str, str | None]],
    role_arn: str | None,
    environ: Mapping[str, str] = os.environ,
    proxied: Callable[[str], bool] | None = None,
) -> str | None:
    """Why the lean path would not do what botocore does here, or None when it would.

    ``calls``: (service, region, endpoint) of each client the processor
    needs, the endpoint as copier's properties give it (None: AWS's own).
    ``proxied(url)``: True when an HTTP proxy applies to that URL.
    """
    if role_arn is not None:
        return "copier.targetRoleArn is set (the role is assumed through botocore's STS client)"
    for name in _BOTOCORE_SETTINGS:
        if environ.get(name):
            return f"{name} is set"
    key, secret = bool(environ.get("AWS_ACCESS_KEY_ID")), bool(environ.get("AWS_SECRET_ACCESS_KEY"))
    if key != secret:
        return "only one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY is set"
    if not key and environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true":
        return "no credentials in the environment and AWS_EC2_METADATA_DISABLED is set"
    if urlsplit(environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "")).scheme.lower() == "https":
        return "AWS_EC2_METADATA_SERVICE_ENDPOINT is an https URL"
    for name in ("AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE"):
        if name in environ and not environ[name].strip():
            return f"{name} is set and blank (botocore refuses it)"
    for path in _config_files(environ):
        # credentials, a profile's endpoint_url, use_fips_endpoint, a proxy...: botocore reads the file;
        # isfile (botocore's own check) never raises on a path it cannot look at
        if os.path.isfile(path):
            return f"{path} exists"
    for service, region, endpoint in calls:
        url = endpoint or endpoint_for(service, region)
        if url is None:
            return f"region {region!r} is in no partition this copier knows"
        if proxied is not None and proxied(url):
            return f"an HTTP proxy is configured for {url}"
    return None


@dataclass(frozen=True)
class _Partition:
    regions: frozenset[str]
    pattern: re.Pattern[str]
    dns_suffix: str


def _partitions() -> list[_Partition]:
    """botocore's partitions.json, read as a file (importing botocore is what the lean path avoids)."""
    spec = importlib.util.find_spec("botocore")
    assert spec is not None and spec.submodule_search_locations, "botocore is a dependency of copier"
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "partitions.json"
    doc = json.loads(path.read_text())
    return [
        _Partition(frozenset(p["regions"]), re.compile(p["regionRegex"]), p["outputs"]["dnsSuffix"])
        for p in doc["partitions"]
    ]


_PARTITIONS: list[_Partition] = []


def _known() -> list[_Partition]:
    if not _PARTITIONS:
        _PARTITIONS.extend(_partitions())
    return _PARTITIONS


def listed_regions() -> frozenset[str]:
    """Every region botocore's partitions list by name (a region newer than botocore matches a pattern only)."""
    return frozenset().union(*(p.regions for p in _known()))


def endpoint_for(service: str, region: str) -> str | None:
    """AWS's standard regional endpoint of ``service`` in ``region`` (None: no partition matches)."""
    for partition in _known():  # a region listed by name wins over a pattern (botocore's order)
        if region in partition.regions:
            return f"https://{service}.{region}.{partition.dns_suffix}"
    for partition in _PARTITIONS:
        if partition.pattern.match(region):
            return f"https://{service}.{region}.{partition.dns_suffix}"
    return None


@functools.lru_cache(maxsize=64)
def host_header(url: str) -> str:
    """The Host header a request to ``url`` carries and is signed with: no userinfo, an IPv6 address in
    brackets, the port only when it is not the scheme's default (botocore's rule). Cached: a client signs
    every request to the same URL."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    default = ":443" if parts.scheme == "https" else ":80"
    return host[: -len(default)] if host.endswith(default) else host


@functools.lru_cache(maxsize=64)
def _path(url: str) -> str:
    return urlsplit(url).path or "/"


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.digest(key, text.encode(), "sha256")


@functools.lru_cache(maxsize=16)
def _signing_key(secret_key: str, day: str, region: str, service: str) -> bytes:
    """SigV4's derived key: four HMACs that change only with the day (and the credentials). Cached, as
    botocore's callers and AWS's own SDKs cache it: a processor signs three requests a delivery, and the
    derivation was most of each signature's cost. Credentials refreshed from the instance profile come
    with a new secret, hence a new entry; the cache is small and holds nothing a caller does not."""
    key = _hmac(f"AWS4{secret_key}".encode(), day)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    return key


_BLOCK = 64  # SHA-256's block size, to which HMAC pads its key
_IPAD = bytes(x ^ 0x36 for x in range(256))  # HMAC's inner and outer pads, applied with bytes.translate
_OPAD = bytes(x ^ 0x5C for x in range(256))


@functools.lru_cache(maxsize=16)
def _signing_pads(secret_key: str, day: str, region: str, service: str) -> tuple[Any, Any]:
    """HMAC-SHA256 under the derived key, its inner and outer key blocks already hashed: a signature copies
    them and hashes only its text (RFC 2104; what ``hmac.new`` redoes from the key on every call). Cached
    as :func:`_signing_key` is, and for the same reason."""
    block = _signing_key(secret_key, day, region, service).ljust(_BLOCK, b"\0")
    return hashlib.sha256(block.translate(_IPAD)), hashlib.sha256(block.translate(_OPAD))


def _signature(pads: tuple[Any, Any], text: str) -> str:
    """HMAC-SHA256 of ``text`` under the key whose pads :func:`_signing_pads` made, in hex."""
    inner, outer = pads[0].copy(), pads[1].copy()
    inner.update(text.encode())
    outer.update(inner.digest())
    return str(outer.hexdigest())


@functools.lru_cache(maxsize=64)
def _canonical_headers(headers: tuple[tuple[str, str], ...], host: str, token: str | None) -> tuple[str, str, str]:
    """The canonical headers of a request with ``headers``, Host and a security token (if any), split around
    X-Amz-Date's line (the one header that changes from call to call), and the signed header names.

    Cached: a client signs every request with the same few headers (one target per operation), and lowering,
    trimming and sorting them was a third of each signature's cost. Built as :func:`sign` builds its
    headers, so a caller's own X-Amz-Date (whatever its case) gives way to the signing time as it did."""
    out = {**dict(headers), "Host": host, "X-Amz-Date": ""}
    if token:
        out["X-Amz-Security-Token"] = token
    signed = {k.lower(): " ".join(v.split()) for k, v in out.items()}
    names = sorted(signed)
    lines = [f"{n}:{signed[n]}\n" for n in names]
    at = names.index("x-amz-date")
    return "".join(lines[:at]), "".join(lines[at + 1 :]), ";".join(names)


_STAMP: list[tuple[int, str]] = [(-1, "")]  # the last second signed in, and its X-Amz-Date


def _stamp(now: dt.datetime | None) -> str:
    """X-Amz-Date of ``now`` (None: the current second, formatted once a second)."""
    if now is not None:
        return now.strftime("%Y%m%dT%H%M%SZ")
    second = int(time.time())
    cached, text = _STAMP[0]
    if cached != second:
        text = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second))
        _STAMP[0] = (second, text)
    return text


def sign(
    credentials: Credentials,
    service: str,
    region: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    now: dt.datetime | None = None,
) -> dict[str, str]:
    """The headers of a SigV4-signed POST of ``body`` to ``url`` (path "/", no query string).

    ``headers`` are the request's own (X-Amz-Target, Content-Type); the
    result adds Host (:func:`host_header`: send exactly this one, it is the
    one signed), X-Amz-Date, X-Amz-Security-Token (if any) and Authorization,
    every header signed, as botocore's ``SigV4Auth`` does (``tests/test_awsauth.py``
    compares the two).
    """
    when = _stamp(now)
    host = host_header(url)
    out = {**headers, "Host": host, "X-Amz-Date": when}
    token = credentials.token or None
    if token:
        out["X-Amz-Security-Token"] = token
    before, after, names = _canonical_headers(tuple(headers.items()), host, token)
    canonical = f"POST\n{_path(url)}\n\n{before}x-amz-date:{when}\n{after}\n{names}\n{hashlib.sha256(body).hexdigest()}"
    scope = f"{when[:8]}/{region}/{service}/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{when}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    signature = _signature(_signing_pads(credentials.secret_key, when[:8], region, service), to_sign)
    out["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, SignedHeaders={names}, Signature={signature}"
    )
    return out
