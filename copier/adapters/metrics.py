"""CloudWatch metrics of a shard: accumulated while forwarding, emitted as Embedded Metric Format.

Why EMF through the CloudWatch agent (aws-embedded-metrics) rather than
PutMetricData: emitting is a local socket write (no AWS call, no throttling,
no credentials on the forwarding path, nothing that can stall a shard), the
agent batches and retries, and each document also lands in CloudWatch Logs
with the shard's properties, so a spike can be traced to its shard. Metrics
are best effort: a missing agent costs a log line, never an event.

Never written to stdout: stdout of ``copier process`` is the MultiLang
protocol. The library's stdout sink ("Local" environment) is never chosen,
and nothing is probed: each emitter uses the library's default environment,
whose sink is the agent's socket (``copier.metricsAgentEndpoint``).

Documents per emit (every ``copier.metricsIntervalSeconds`` and when the
shard ends or is released), namespace ``copier.metricsNamespace``:

* dimension sets ``[Application]``, ``[Application, ShardId]`` and
  ``[Application, WorkerId]`` (the host): EventsForwarded, DuplicatesDropped,
  ReplaysDropped, DeadLettered, UnkeyedEvents, PossibleDuplicates (Count,
  since the last emit); MillisBehindLatest (the largest seen); PutLatency
  (Milliseconds, up to 100 request times); DedupWindowSpan (Seconds);
  DedupWindowIds (Count); ShardStalled (1 while AWS rejects the shard's
  requests, else 0; while it is 1 the document's ``StallReason`` property
  says why: ``clock`` when AWS refuses this host's requests for their time,
  ``rejected`` for a request AWS rejects as final, ``stream_settings`` for a
  stream setting copier stops under); ClockBoundMs (Milliseconds: the largest difference
  between this host's clock and AWS time that the ``Date`` headers of the
  last 10 minutes of answers allow, ``copier.core.clockcheck``; only once the
  caller has one), to alarm on before it nears ``copier.clockSkewMillis``;
  RecordAgeP50, RecordAgeP99, RecordAgeMax (Milliseconds: how old the events
  forwarded to the target in the interval were when they landed, the put's
  answer minus the staging arrival, ``copier.core.recordage``; only when some
  landed), the record age at the target;
* one more per error code with retried entries, dimension set
  ``[Application, ErrorCode]``: PutRetries (Count).
"""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from copier.core.config import Config
from copier.core.recordage import AgeHistogram, AgeSummary

__all__ = [
    "COUNTERS",
    "EmfEmitter",
    "MetricsEmitter",
    "ShardMetrics",
    "emitter_for",
    "metric_names",
    "record_age_values",
    "sample_values",
]

# State counter -> metric name (Count, per emit interval).
COUNTERS = {
    "forwarded": "EventsForwarded",
    "duplicates": "DuplicatesDropped",
    "replays": "ReplaysDropped",
    "dead_lettered": "DeadLettered",
    "unkeyed": "UnkeyedEvents",
}
MAX_VALUES = 100  # EMF: at most 100 values in one metric's array
RETRIES_METRIC = "PutRetries"  # a document of its own per error code (EmfEmitter.emit)

Values = dict[str, tuple[float | list[float], str]]


@dataclass
class ShardMetrics:
    """What one shard did since the last emit. Pure bookkeeping: no I/O."""

    last_emit_ms: int = 0
    counts_at_emit: dict[str, int] = field(default_factory=dict)
    put_retries: Counter[str] = field(default_factory=Counter)
    put_latency_ms: list[float] = field(default_factory=list)
    behind_ms: int | None = None
    possible_duplicates: int = 0
    stalled: bool = False
    stall_reason: str = ""  # why, while stalled: "clock", "rejected" or "stream_settings"
    record_age: AgeHistogram = field(default_factory=AgeHistogram)  # ages at the target (ShardSession.on_landed)

    def saw_put(self, millis: float | None) -> None:
        if millis is not None and len(self.put_latency_ms) < MAX_VALUES:
            self.put_latency_ms.append(round(millis, 1))

    def saw_behind(self, behind_ms: int | None) -> None:
        if behind_ms is not None and (self.behind_ms is None or behind_ms > self.behind_ms):
            self.behind_ms = behind_ms

    def due(self, now_ms: int, interval_s: int) -> bool:
        return now_ms - self.last_emit_ms >= interval_s * 1000

    def take(
        self,
        counts: Mapping[str, int],
        window_ids: int,
        window_span_s: float,
        now_ms: int,
        clock_bound_ms: int | None = None,
    ) -> Values:
        """The values of this interval; starts the next one.

        ``clock_bound_ms`` is ``ClockBounds.bound_ms()`` at the time of the
        emit, a gauge (None: not measured yet, and no ClockBoundMs value).
        """
        values: Values = {
            metric: (float(counts.get(name, 0) - self.counts_at_emit.get(name, 0)), "Count")
            for name, metric in COUNTERS.items()
        }
        values["PossibleDuplicates"] = (float(self.possible_duplicates), "Count")
        values["ShardStalled"] = (1.0 if self.stalled else 0.0, "None")
        values["DedupWindowIds"] = (float(window_ids), "Count")
        values["DedupWindowSpan"] = (round(window_span_s, 1), "Seconds")
        if self.behind_ms is not None:
            values["MillisBehindLatest"] = (float(self.behind_ms), "Milliseconds")
        if self.put_latency_ms:
            values["PutLatency"] = (list(self.put_latency_ms), "Milliseconds")
        if clock_bound_ms is not None:
            values["ClockBoundMs"] = (float(clock_bound_ms), "Milliseconds")
        values.update(record_age_values(self.record_age.take()))
        self.counts_at_emit = dict(counts)
        self.put_latency_ms.clear()
        self.behind_ms = None
        self.possible_duplicates = 0
        self.last_emit_ms = now_ms
        return values

    def properties(self) -> dict[str, str]:
        """The document's properties beside its values: why the shard is stalled, while it is."""
        return {"StallReason": self.stall_reason} if self.stalled and self.stall_reason else {}

    def take_retries(self) -> dict[str, int]:
        retries, self.put_retries = dict(self.put_retries), Counter()
        return retries


def record_age_values(summary: AgeSummary | None) -> Values:
    """The record age at the target for an interval: its p50, p99 and maximum, as gauges (none when nothing
    landed: an idle shard has no age, and an alarm on the maximum treats that as not breaching). Percentiles
    within 0.8 %, the maximum exact (``copier.core.recordage``); one value each, so a dashboard's Maximum of
    RecordAgeMax over shards is the oldest event any shard landed."""
    if summary is None:
        return {}
    return {
        "RecordAgeP50": (float(summary.p50_ms), "Milliseconds"),
        "RecordAgeP99": (float(summary.p99_ms), "Milliseconds"),
        "RecordAgeMax": (float(summary.max_ms), "Milliseconds"),
    }


def sample_values() -> tuple[Values, dict[str, int]]:
    """What :meth:`EmfEmitter.emit` is given after an interval in which a shard did everything once (a put, a
    retried entry, a lag, a stall, an event landed, a clock bound): every metric it can send, taken from
    :meth:`ShardMetrics.take` itself so that it cannot drift from it. The deployment's tests emit it to read
    each metric's dimension sets."""
    metrics = ShardMetrics()
    metrics.saw_put(1.0)
    metrics.saw_behind(1)
    metrics.record_age.add(1)
    metrics.stalled = True
    metrics.put_retries["ProvisionedThroughputExceededException"] += 1
    return metrics.take({}, 0, 0.0, now_ms=0, clock_bound_ms=0), metrics.take_retries()


def metric_names() -> frozenset[str]:
    """Every metric name copier emits (:func:`sample_values`, and the retries' own metric). The deployment's
    alarms and dashboard are checked against it (tests/test_deploy.py)."""
    return frozenset(sample_values()[0]) | {RETRIES_METRIC}


class MetricsEmitter(Protocol):
    def emit(
        self, shard_id: str, values: Values, retries: Mapping[str, int], properties: Mapping[str, str] | None = None
    ) -> None: ...


class EmfEmitter:
    """Sends EMF documents to the CloudWatch agent's socket with aws-embedded-metrics."""

    def __init__(self, config: Config, worker: str | None = None) -> None:
        from aws_embedded_metrics.config import get_config
        from aws_embedded_metrics.environment.default_environment import DefaultEnvironment

        settings = get_config()
        settings.agent_endpoint = config.metrics_agent_endpoint
        settings.namespace = config.metrics_namespace
        settings.service_name = "copier"
        settings.log_group_name = f"{config.metrics_namespace}-metrics"
        self.application = config.application_name
        self.stream = config.stream_name
        self.namespace = config.metrics_namespace
        self.worker = worker or socket.gethostname()
        self.log = structlog.get_logger("copier.metrics")
        self._environment = DefaultEnvironment()  # the agent's socket, opened at the first emit

    async def _resolve(self) -> Any:
        return self._environment

    def _logger(self) -> Any:
        from aws_embedded_metrics.logger.metrics_context import MetricsContext
        from aws_embedded_metrics.logger.metrics_logger import MetricsLogger

        logger = MetricsLogger(self._resolve, MetricsContext.empty())
        logger.set_namespace(self.namespace)
        logger.set_property("StagingStream", self.stream)
        return logger

    def emit(
        self, shard_id: str, values: Values, retries: Mapping[str, int], properties: Mapping[str, str] | None = None
    ) -> None:
        try:
            logger = self._logger()
            app = {"Application": self.application}
            logger.set_dimensions(app, {**app, "ShardId": shard_id}, {**app, "WorkerId": self.worker})
            logger.set_property("ShardId", shard_id)
            logger.set_property("WorkerId", self.worker)
            for name, text in (properties or {}).items():
                logger.set_property(name, text)
            for name, (value, unit) in values.items():
                if isinstance(value, list):
                    for v in value:
                        logger.put_metric(name, v, unit)
                else:
                    logger.put_metric(name, value, unit)
            logger.flush_sync()
            for code, count in retries.items():
                logger = self._logger()
                logger.set_dimensions({**app, "ErrorCode": code})
                logger.set_property("ShardId", shard_id)
                logger.put_metric(RETRIES_METRIC, float(count), "Count")
                logger.flush_sync()
        except Exception as e:  # best effort: metrics never stop forwarding
            self.log.warning("metrics_failed", error=f"{type(e).__name__}: {e}")


def emitter_for(config: Config) -> MetricsEmitter | None:
    """The emitter ``copier.metrics`` asks for (None: metrics off)."""
    return EmfEmitter(config) if config.metrics == "emf" else None
