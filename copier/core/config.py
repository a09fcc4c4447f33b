"""copier's configuration: the ``copier.*`` keys (and a few KCL keys) of one properties file.

The file is parsed once, here, into a frozen :class:`Config` that is passed
down; nothing reads settings at import time. Every problem is reported as a
:class:`~copier.core.errors.ConfigError` naming the file, the key and what is wrong,
before any AWS call is made. Unknown ``copier.*`` keys are errors (a typo in a
key must not silently fall back to a default); other keys belong to the KCL
daemon and are left to it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from copier.core.errors import ConfigError
from copier.core.properties import parse_properties
from copier.core.propertylint import close_key
from copier.core.startpoint import parse_start

__all__ = [
    "COPIER_KEYS",
    "DEFAULTS",
    "PATTERNS",
    "RENAMED",
    "Config",
    "DedupKey",
    "load_config",
    "parse_config",
    "parse_dedup_key",
]

UnkeyedPolicy = Literal["forward", "deadletter"]
T = TypeVar("T")

_APPLICATION_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,200}$")
_STREAM_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
_TABLE_NAME = re.compile(r"^[a-zA-Z0-9_.-]{3,255}$")
_DEDUP_KEY = re.compile(r"^(partitionKey|json:[^.\s]+(\.[^.\s]+)*)$")
_NAMESPACE = re.compile(r"^[a-zA-Z0-9._#:/-]{1,255}$")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
_EXTERNAL_ID = re.compile(r"^[\w+=,.@:/-]{2,1224}$")
_SESSION_NAME = re.compile(r"^[\w+=,.@-]{2,64}$")
_WORKER_ID = re.compile(r"^[a-zA-Z0-9_.:-]{1,128}$")  # an EC2 instance ID, a host name
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_LOOPBACK_HOSTS = ("localhost", "[::1]")

# The rules of the keys a deployment sets from outside (scripts/copier.yaml's parameters, through
# ``copier configure``): the template's AllowedPattern of each is this pattern (tests/test_configure.py).
PATTERNS: dict[str, re.Pattern[str]] = {
    "applicationName": _APPLICATION_NAME,
    "streamName": _STREAM_NAME,
    "regionName": _REGION,
    "copier.targetStreamName": _STREAM_NAME,
    "copier.deadLetterStreamName": _STREAM_NAME,
    "copier.targetRoleArn": _ROLE_ARN,
    "copier.targetExternalId": _EXTERNAL_ID,
    "copier.targetRegionName": _REGION,
    "copier.metricsNamespace": _NAMESPACE,
    "copier.dedupKey": _DEDUP_KEY,
    "workerId": _WORKER_ID,  # the host's own (its EC2 instance ID), written by the user data
    "initialPositionInStream": re.compile(r"^(TRIM_HORIZON|LATEST)$"),
    "initialPositionInStreamExtended": re.compile(r"^[1-9][0-9]{8,9}$"),  # epoch seconds (copier.core.startpoint)
}


@dataclass(frozen=True)
class DedupKey:
    """Where a record's event ID lives: a dotted path in a JSON payload, or the partition key."""

    kind: Literal["json", "partitionKey"]
    path: tuple[str, ...] = ()

    def __str__(self) -> str:
        return "partitionKey" if self.kind == "partitionKey" else "json:" + ".".join(self.path)


@dataclass(frozen=True)
class Config:
    """Everything copier needs from the properties file, validated."""

    path: str
    application_name: str
    stream_name: str
    region: str
    kinesis_endpoint: str | None
    dynamodb_endpoint: str | None
    target_endpoint: str | None  # Kinesis endpoint of the target and dead-letter streams (default kinesisEndpoint)
    state_endpoint: str | None  # DynamoDB endpoint of the state table (default dynamoDBEndpoint)
    failover_time_millis: int
    target_stream_name: str
    state_table_name: str
    dedup_key: DedupKey
    lease_millis: int
    dedup_window_seconds: int
    dedup_window_max_events: int
    digest_ttl_hours: int
    unkeyed_policy: UnkeyedPolicy
    dead_letter_stream_name: str | None
    checkpoint_interval_millis: int
    put_timeout_millis: int
    clock_skew_millis: int
    max_backoff_millis: int
    log_level: str
    jvm_args: tuple[str, ...]
    executable_name: str | None
    shutdown_grace_millis: int
    coalesce_events: int
    coalesce_millis: int
    empty_batches: bool  # the daemon's callProcessRecordsEvenForEmptyRecordList
    graceful_handoff: bool = True  # the daemon's isGracefulLeaseHandoffEnabled (KCL 3.x default: true)
    metrics: Literal["none", "emf"] = "none"
    metrics_agent_endpoint: str = "tcp://127.0.0.1:25888"
    metrics_namespace: str = "copier"
    metrics_interval_seconds: int = 60
    progress_interval_seconds: int = 60  # a progress line per shard this often at INFO (0: none)
    daemon_log_level: str = "WARN"  # the MultiLangDaemon's own log (its chatter) below copier's lines
    jvm_class_archive: str = "auto"  # where the daemon JVM's class-data archive lives (copier.kcl.classarchive)
    dispatch_millis: int = 200  # how often the KCL's scheduler advances shard consumers (copier.kcl.launcher)
    empty_table_wait_millis: int = 3000  # longest wait for another worker to create a new table's leases
    leader_lock_millis: int = 10000  # how long a KCL 3.x leader's lock outlives its last renewal
    worker_id: str = ""  # the daemon's workerId; empty: the KCL draws a new one each run
    ordering: Literal["partitionKey", "none"] = "partitionKey"
    target_region: str = ""  # region of the target and dead-letter streams (default regionName)
    target_role_arn: str | None = None  # assumed to reach the target (another account)
    target_external_id: str | None = None
    target_role_session_name: str = "copier"
    target_role_session_seconds: int = 3600
    # the application's start (copier.core.startpoint): the KCL's initialPositionInStreamExtended, in ms
    start_ms: int | None = None
    lease_table_name: str = ""  # the KCL's lease table: tableName, default applicationName

    @property
    def dedup_window_ms(self) -> int:
        return self.dedup_window_seconds * 1000

    @property
    def coalescing(self) -> bool:
        """Small deliveries wait to be forwarded together: only when the daemon calls on empty polls too,
        so that a waiting record is never stuck behind an idle shard."""
        return self.empty_batches and self.coalesce_events > 1 and self.coalesce_millis > 0


def parse_dedup_key(value: str) -> DedupKey:
    """``json:<dotted.path>`` or ``partitionKey``; ValueError otherwise."""
    if value == "partitionKey":
        return DedupKey("partitionKey")
    if value.startswith("json:") and _DEDUP_KEY.match(value):
        return DedupKey("json", tuple(value[5:].split(".")))
    raise ValueError(f"expected json:<dotted.path> or partitionKey, got {value!r}")


def _int_between(low: int, high: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"expected a whole number, got {value!r}") from None
        if not low <= number <= high:
            raise ValueError(f"expected a number from {low} to {high}, got {number}")
        return number

    return parse


def _matching(pattern: re.Pattern[str], what: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(f"not a valid {what}: {value!r}")
        return value

    return parse


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    return parse


def _archive_setting(value: str) -> str:
    """``auto``, ``none`` or an absolute directory."""
    if value in ("auto", "none") or value.startswith("/"):
        return value
    raise ValueError("must be auto, none or an absolute directory")


def _boolean(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise ValueError(f"expected true or false, got {value!r}")
    return value.lower() == "true"


def _agent_endpoint(value: str) -> str:
    if not re.match(r"^(tcp|udp)://[^\s/:]+:\d+$", value):
        raise ValueError(f"expected tcp://HOST:PORT or udp://HOST:PORT (the CloudWatch agent), got {value!r}")
    return value


def _endpoint(value: str) -> str:
    """An https:// URL, or http:// to this machine only (the local backend): AWS credentials sign every
    request, and the signature and the data must not travel in clear over a network."""
    match = re.match(r"^(https?)://([^\s/:]+|\[[0-9a-fA-F:]+\])(:\d+)?/?$", value)
    if not match:
        raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
    scheme, host = match.group(1), match.group(2).lower()
    if scheme == "http" and not (host in _LOOPBACK_HOSTS or re.match(r"^127(\.\d{1,3}){3}$", host)):
        raise ValueError(
            f"plain http:// is for this machine only (127.0.0.0/8, [::1], localhost), got {value!r}: use https://"
        )
    return value


_MINUTE_MS = 60_000
_DAY_MS = 24 * 60 * _MINUTE_MS

# The documented defaults, each shown with its meaning in properties/copier.properties.
# ``None``: required; ``""``: optional with no value.
DEFAULTS: dict[str, str | None] = {
    "copier.targetStreamName": None,
    "copier.targetEndpoint": "",
    "copier.stateTableEndpoint": "",
    "copier.stateTableName": "",
    "copier.dedupKey": None,
    "copier.leaseMillis": "",
    "copier.dedupWindowSeconds": "3600",
    "copier.dedupWindowMaxEvents": "5000000",
    "copier.digestTtlHours": "48",
    "copier.unkeyedPolicy": "forward",
    "copier.deadLetterStreamName": "",
    "copier.checkpointIntervalMillis": "60000",
    "copier.putTimeoutMillis": "5000",
    "copier.clockSkewMillis": "1000",
    "copier.maxBackoffMillis": "10000",
    "copier.coalesceEvents": "500",
    "copier.coalesceMillis": "200",
    "copier.logLevel": "INFO",
    "copier.progressIntervalSeconds": "60",
    "copier.daemonLogLevel": "WARN",
    "copier.jvmArgs": "",
    "copier.jvmClassArchive": "auto",
    "copier.shardConsumerDispatchPollIntervalMillis": "200",
    "copier.emptyLeaseTableWaitMillis": "3000",
    "copier.leaderLockMillis": "10000",
    "copier.metrics": "none",
    "copier.metricsAgentEndpoint": "tcp://127.0.0.1:25888",
    "copier.metricsNamespace": "copier",
    "copier.metricsIntervalSeconds": "60",
    "copier.ordering": "partitionKey",
    "copier.targetRegionName": "",
    "copier.targetRoleArn": "",
    "copier.targetExternalId": "",
    "copier.targetRoleSessionName": "",
    "copier.targetRoleSessionSeconds": "3600",
}
COPIER_KEYS = tuple(DEFAULTS)

# Keys of earlier versions, with what replaced them: a file written for an
# earlier copier gets a pointer, not just "unknown key".
RENAMED = {
    "copier.dedupWindowEvents": "the window is measured in time now: set copier.dedupWindowSeconds "
    "(default 3600); copier.dedupWindowMaxEvents (default 5000000) caps its size",
}


class _Reader:
    """Looks keys up in the parsed file and turns a bad value into a ConfigError."""

    def __init__(self, raw: dict[str, str], path: str, lines: dict[str, int]) -> None:
        self.raw = raw
        self.path = path
        self.lines = lines  # where each key is (the last time it is given, the one that counts)

    def fail(self, key: str, problem: str) -> ConfigError:
        """The error for ``key``, at its line when the file gives it (a missing key has none)."""
        return ConfigError(self.path, key, problem, self.lines.get(key))

    def get(self, key: str, parse: Callable[[str], T], default: str | None) -> T | None:
        value = self.raw.get(key, "").strip()
        if not value:
            if default is None:
                raise self.fail(key, "required key is missing")
            if default == "":
                return None
            value = default
        try:
            return parse(value)
        except ValueError as exc:
            raise self.fail(key, str(exc)) from None

    def need(self, key: str, parse: Callable[[str], T], default: str | None = None) -> T:
        value = self.get(key, parse, default)
        assert value is not None, key
        return value

    def copier(self, key: str, parse: Callable[[str], T]) -> T | None:
        return self.get(key, parse, DEFAULTS[key])

    def copier_need(self, key: str, parse: Callable[[str], T]) -> T:
        return self.need(key, parse, DEFAULTS[key])


def parse_config(text: str, path: str = "<string>") -> Config:
    """Validate properties text into a :class:`Config`, or raise ConfigError."""
    parsed = parse_properties(text)
    raw = {key: value for key, (_, value) in parsed.items()}
    r = _Reader(raw, path, {key: line for key, (line, _) in parsed.items()})
    for key in raw:
        if key in RENAMED:
            raise r.fail(key, f"no longer read: {RENAMED[key]}")
        if key.startswith("copier.") and key not in DEFAULTS:
            guess = close_key(key, list(DEFAULTS))
            hint = f"did you mean {guess}?" if guess else f"known keys: {', '.join(sorted(DEFAULTS))}"
            raise r.fail(key, f"unknown copier key ({hint})")

    application_name = r.need("applicationName", _matching(_APPLICATION_NAME, "application name"))
    stream_name = r.need("streamName", _matching(_STREAM_NAME, "stream name"))
    failover = r.need("failoverTimeMillis", _int_between(1000, _DAY_MS), "10000")
    target = r.copier_need("copier.targetStreamName", _matching(_STREAM_NAME, "stream name"))
    if target == stream_name:
        raise r.fail("copier.targetStreamName", "must differ from streamName (copying a stream onto itself loops)")
    policy = r.copier_need("copier.unkeyedPolicy", _one_of("forward", "deadletter"))
    dlq = r.copier("copier.deadLetterStreamName", _matching(_STREAM_NAME, "stream name"))
    if policy == "deadletter" and dlq is None:
        raise r.fail("copier.deadLetterStreamName", "required when copier.unkeyedPolicy = deadletter")
    if dlq is not None and dlq in (target, stream_name):
        raise r.fail("copier.deadLetterStreamName", "must differ from streamName and copier.targetStreamName")
    put_timeout = r.copier_need("copier.putTimeoutMillis", _int_between(100, 10 * _MINUTE_MS))
    skew = r.copier_need("copier.clockSkewMillis", _int_between(0, 10 * _MINUTE_MS))
    lease = r.copier("copier.leaseMillis", _int_between(1000, _DAY_MS)) or failover
    if put_timeout + skew >= lease:
        raise r.fail(
            "copier.leaseMillis",
            f"{lease} ms leaves no time to put: it must exceed copier.putTimeoutMillis "
            f"+ copier.clockSkewMillis ({put_timeout} + {skew} ms)",
        )
    table = r.copier("copier.stateTableName", _matching(_TABLE_NAME, "table name"))
    kinesis_endpoint = r.get("kinesisEndpoint", _endpoint, "")
    dynamodb_endpoint = r.get("dynamoDBEndpoint", _endpoint, "")
    window_seconds = r.copier_need("copier.dedupWindowSeconds", _int_between(0, 7 * 24 * 3600))
    ttl_hours = r.copier_need("copier.digestTtlHours", _int_between(1, 24 * 365))
    if ttl_hours * 3600 <= window_seconds:
        raise r.fail(
            "copier.digestTtlHours",
            f"{ttl_hours} h does not outlive the dedup window ({window_seconds} s): stored digests would expire "
            "while the window still needs them; set it above copier.dedupWindowSeconds plus the staging "
            "stream's retention",
        )
    ordering = r.copier_need("copier.ordering", _one_of("partitionKey", "none"))
    region = r.need("regionName", _matching(_REGION, "region"))
    role = r.copier("copier.targetRoleArn", _matching(_ROLE_ARN, "IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME)"))
    external_id = r.copier("copier.targetExternalId", _matching(_EXTERNAL_ID, "external ID (2-1224 characters)"))
    session_name = r.copier("copier.targetRoleSessionName", _matching(_SESSION_NAME, "role session name"))
    if role is None:
        for key, value in (("copier.targetExternalId", external_id), ("copier.targetRoleSessionName", session_name)):
            if value is not None:
                raise r.fail(key, "needs copier.targetRoleArn (it is used only to assume that role)")
    return Config(
        path=path,
        application_name=application_name,
        stream_name=stream_name,
        region=region,
        kinesis_endpoint=kinesis_endpoint,
        dynamodb_endpoint=dynamodb_endpoint,
        target_endpoint=r.copier("copier.targetEndpoint", _endpoint) or kinesis_endpoint,
        state_endpoint=r.copier("copier.stateTableEndpoint", _endpoint) or dynamodb_endpoint,
        failover_time_millis=failover,
        target_stream_name=target,
        state_table_name=table or f"{application_name}-copier-state",
        dedup_key=r.copier_need("copier.dedupKey", parse_dedup_key),
        lease_millis=lease,
        dedup_window_seconds=window_seconds,
        dedup_window_max_events=r.copier_need("copier.dedupWindowMaxEvents", _int_between(0, 100_000_000)),
        digest_ttl_hours=ttl_hours,
        unkeyed_policy="deadletter" if policy == "deadletter" else "forward",
        dead_letter_stream_name=dlq,
        checkpoint_interval_millis=r.copier_need("copier.checkpointIntervalMillis", _int_between(0, _DAY_MS)),
        put_timeout_millis=put_timeout,
        clock_skew_millis=skew,
        max_backoff_millis=r.copier_need("copier.maxBackoffMillis", _int_between(10, 10 * _MINUTE_MS)),
        log_level=r.copier_need("copier.logLevel", _one_of(*_LOG_LEVELS)),
        progress_interval_seconds=r.copier_need("copier.progressIntervalSeconds", _int_between(0, 86_400)),
        daemon_log_level=r.copier_need("copier.daemonLogLevel", _one_of("ERROR", "WARN", "INFO", "DEBUG")),
        jvm_args=tuple((r.copier("copier.jvmArgs", str) or "").split()),
        jvm_class_archive=r.copier_need("copier.jvmClassArchive", _archive_setting),
        dispatch_millis=r.copier_need("copier.shardConsumerDispatchPollIntervalMillis", _int_between(50, 10_000)),
        empty_table_wait_millis=r.copier_need("copier.emptyLeaseTableWaitMillis", _int_between(0, 30_000)),
        leader_lock_millis=r.copier_need("copier.leaderLockMillis", _int_between(4_000, 120_000)),
        worker_id=raw.get("workerId", "").strip(),
        executable_name=r.get("executableName", str, ""),
        shutdown_grace_millis=r.need("shutdownGraceMillis", _int_between(0, _DAY_MS), "0"),
        coalesce_events=r.copier_need("copier.coalesceEvents", _int_between(1, 10_000)),
        coalesce_millis=r.copier_need("copier.coalesceMillis", _int_between(0, _MINUTE_MS)),
        empty_batches=r.need("callProcessRecordsEvenForEmptyRecordList", _boolean, "false"),
        graceful_handoff=r.need("isGracefulLeaseHandoffEnabled", _boolean, "true"),
        metrics="emf" if r.copier_need("copier.metrics", _one_of("none", "emf")) == "emf" else "none",
        metrics_agent_endpoint=r.copier_need("copier.metricsAgentEndpoint", _agent_endpoint),
        metrics_namespace=r.copier_need("copier.metricsNamespace", _matching(_NAMESPACE, "CloudWatch namespace")),
        metrics_interval_seconds=r.copier_need("copier.metricsIntervalSeconds", _int_between(1, 3600)),
        ordering="none" if ordering == "none" else "partitionKey",
        target_region=r.copier("copier.targetRegionName", _matching(_REGION, "region")) or region,
        target_role_arn=role,
        target_external_id=external_id,
        target_role_session_name=session_name or f"copier-{application_name}"[:64],
        target_role_session_seconds=r.copier_need("copier.targetRoleSessionSeconds", _int_between(900, 43200)),
        start_ms=parse_start(raw, path, r.lines),
        lease_table_name=raw.get("tableName", "").strip() or application_name,
    )


def load_config(path: str | Path) -> Config:
    """Read and validate a properties file; a missing or unreadable file is a ConfigError too."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(name, "-", f"cannot read the file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(name, "-", "not UTF-8 text") from None
    return parse_config(text, name)
