"""The keys the KCL 3.1.3 MultiLangDaemon reads from the properties file, with the type each value must have.

Why the types: the daemon sets each key on its configuration bean through
Apache BeanUtils (``KinesisClientLibConfigurator``), whose converters turn a
number or a boolean they cannot parse into 0 or ``false`` without a word
(measured against the 3.1.3 jars: ``shardSyncIntervalMillis = 1s`` is read
as 0, ``maxRecords = 1e3`` as 0, ``cleanupLeasesUponShardCompletion = maybe``
as false), while an enumeration or a duration it cannot parse ends the
daemon at its start with a Java stack trace. Either way the file says one
thing and the daemon runs (or dies) on another, so ``copier check-config``
and ``copier run`` check each KCL key's value against its type here first.

The types are those of ``MultiLangDaemonConfiguration`` and the beans it
delegates to (``PollingConfigBean``, ``GracefulLeaseHandoffConfigBean``,
``WorkerUtilizationAwareAssignmentConfigBean``, ``WorkerMetricStatsTableConfigBean``,
``CoordinatorStateTableConfigBean``) in amazon-kinesis-client-multilang 3.1.3;
the words each converter accepts are BeanUtils' (booleans) and the enums'
own (the KCL upper-cases the value first).
"""

from __future__ import annotations

import re

__all__ = ["KCL_KEYS", "KCL_TYPES", "kcl_value_problem"]

_LONG = (-(2**63), 2**63 - 1)
_INT = (-(2**31), 2**31 - 1)
_ENUMS = {
    "initialPositionInStream": ("LATEST", "TRIM_HORIZON", "AT_TIMESTAMP"),
    "metricsLevel": ("NONE", "SUMMARY", "DETAILED"),
    "retrievalMode": ("FANOUT", "POLLING", "DEFAULT"),
    "clientVersionConfig": ("CLIENT_VERSION_CONFIG_COMPATIBLE_WITH_2X", "CLIENT_VERSION_CONFIG_3X"),
    "workerMetricsBillingMode": ("PROVISIONED", "PAY_PER_REQUEST"),
    "coordinatorStateBillingMode": ("PROVISIONED", "PAY_PER_REQUEST"),
}
_TYPED = {
    "long": "failoverTimeMillis leaseAssignmentIntervalMillis shardSyncIntervalMillis listShardsBackoffTimeInMillis "
    "parentShardPollIntervalMillis schedulerInitializationBackoffTimeMillis taskBackoffTimeMillis "
    "metricsBufferTimeMillis logWarningForTaskAfterMillis shutdownGraceMillis idleTimeBetweenReadsInMillis "
    "millisBehindLatestThresholdForReducedTps gracefulLeaseHandoffTimeoutMillis "
    "inMemoryWorkerMetricsCaptureFrequencyMillis workerMetricsReporterFreqInMillis workerMetricsReadCapacity "
    "workerMetricsWriteCapacity coordinatorStateReadCapacity coordinatorStateWriteCapacity",
    "int": "maxLeasesForWorker maxLeasesToStealAtOneTime initialLeaseTableReadCapacity initialLeaseTableWriteCapacity "
    "maxLeaseRenewalThreads maxListShardsRetryAttempts metricsMaxQueueSize timeoutInSeconds retryGetRecordsInSeconds "
    "maxGetRecordsThreadPool maxRecords noOfPersistedMetricsPerWorkerMetrics dampeningPercentage "
    "reBalanceThresholdPercentage varianceBalancingFrequency",
    "double": "maxThroughputPerHostKBps workerMetricsEMAAlpha",
    "boolean": "enablePriorityLeaseAssignment leaseTableDeletionProtectionEnabled leaseTablePitrEnabled "
    "cleanupLeasesUponShardCompletion ignoreUnexpectedChildShards callProcessRecordsEvenForEmptyRecordList "
    "skipShardSyncAtWorkerInitializationIfLeasesExist validateSequenceNumberBeforeCheckpointing "
    "isGracefulLeaseHandoffEnabled disableWorkerMetrics allowThroughputOvershoot "
    "workerMetricsPointInTimeRecoveryEnabled workerMetricsDeletionProtectionEnabled "
    "coordinatorStatePointInTimeRecoveryEnabled coordinatorStateDeletionProtectionEnabled",
    "duration": "staleWorkerMetricsEntryCleanupDuration",
    "epochSeconds": "initialPositionInStreamExtended",
    # Read as text (names, ARNs, URLs, lists and tags, a credentials provider chain, any region name).
    "text": "executableName workerId metricsEnabledDimensions AwsCredentialsProvider AwsCredentialsProviderDynamoDB "
    "AwsCredentialsProviderCloudWatch regionName kinesisEndpoint dynamoDBEndpoint applicationName streamName "
    "streamArn tableName workerIdentifier shardPrioritization workerMetricsTableName workerMetricsTags "
    "coordinatorStateTableName coordinatorStateTags",
}
#: Every key the daemon reads, with its type: long, int, double, boolean, duration, epochSeconds, text, or
#: ``enum:A|B|...``. The daemon compares keys case-insensitively and ignores any other key.
KCL_TYPES: dict[str, str] = {
    **{key: kind for kind, keys in _TYPED.items() for key in keys.split()},
    **{key: "enum:" + "|".join(values) for key, values in _ENUMS.items()},
}
KCL_KEYS = tuple(KCL_TYPES)
_BY_LOWER = {key.lower(): kind for key, kind in KCL_TYPES.items()}

_WHOLE = re.compile(r"^[+-]?\d+$")
_DECIMAL = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?[dDfF]?$")
# java.time.Duration.parse: PnDTnHnMn.nS, each part optional, signs allowed, case-insensitive.
_DURATION = re.compile(
    r"^[-+]?P(?:[-+]?\d+D)?(?:T(?=[-+]?\d)(?:[-+]?\d+H)?(?:[-+]?\d+M)?(?:[-+]?\d+(?:[.,]\d{0,9})?S)?)?$", re.I
)
_TRUE = ("true", "yes", "y", "on", "1")  # BeanUtils' BooleanConverter
_FALSE = ("false", "no", "n", "off", "0")
_UNIT_MS = {"ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}
_WITH_UNIT = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|sec|s|min|m|h)$", re.I)


def _whole(value: str, bounds: tuple[int, int], key: str) -> str | None:
    if _WHOLE.match(value):
        number = int(value)
        return None if bounds[0] <= number <= bounds[1] else f"{number} is out of the range of a Java number"
    hint = ""
    unit = _WITH_UNIT.match(value)
    if unit and key.lower().endswith("millis"):
        hint = f" (in milliseconds: {round(float(unit.group(1)) * _UNIT_MS[unit.group(2).lower()])})"
    return f"not a whole number: the KCL daemon would read it as 0 without a word; give digits only{hint}"


def kcl_value_problem(key: str, value: str) -> str | None:
    """What is wrong with ``value`` for the KCL key ``key``, or None (also for a key the KCL does not read)."""
    kind = _BY_LOWER.get(key.lower())
    value = value.strip()
    if kind is None or kind == "text":
        return None
    if kind == "long":
        return _whole(value, _LONG, key)
    if kind == "int":
        return _whole(value, _INT, key)
    if kind == "double":
        ok = _DECIMAL.match(value) and value.lower() not in ("nan", "infinity")
        return None if ok else "not a number: the KCL daemon would read it as 0 without a word"
    if kind == "boolean":
        if value.lower() in _TRUE + _FALSE:
            return None
        return "not true or false: the KCL daemon would read it as false without a word"
    if kind == "duration":
        if _DURATION.match(value) and re.search(r"\d", value) and not value.startswith("-"):
            return None
        return "not an ISO-8601 duration such as PT1H or P1D: the KCL daemon would fail at its start"
    if kind == "epochSeconds":
        return None if _WHOLE.match(value) else "not a time in epoch seconds: the KCL daemon would fail at its start"
    choices = kind.removeprefix("enum:").split("|")
    if value.upper() in choices:
        return None
    return f"expected one of {', '.join(choices)}: the KCL daemon would fail at its start"
