"""How the KCL daemon reads staging: polling (GetRecords) or enhanced fan-out (SubscribeToShard).

``retrievalMode`` is the KCL MultiLangDaemon's key; copier reads it too,
because the two modes differ in what the application costs and shares, and
``copier check-config`` says which one the file selects and what that
means. The daemon resolves it as this module does (KCL 3.1.3,
``multilang.config.RetrievalMode`` and ``PollingConfigBean.anyPropertiesSet``,
read in the jar): ``FANOUT`` or ``POLLING`` as given; ``DEFAULT`` or no key
is polling when any polling key is set (it logs "Some polling properties
have been set, defaulting to polling"), else fan-out.

What changes for copier, key by key (what does not change is said too, so
that nobody has to find it again):

* Reads. Polling shares each staging shard's 5 GetRecords a second and
  2 MiB/s with every other reader of staging (a second application,
  ``copier status``'s waiting read, a load before a start); fan-out gives the
  application its own 2 MiB/s per shard, pushed about 70 ms after the write,
  and leaves the shared budget to the other readers. ``maxRecords``,
  ``idleTimeBetweenReadsInMillis`` and the other polling keys are not used.
* The registered consumer. The daemon registers a consumer named
  ``applicationName`` (``fanoutConfig.consumerName`` overrides it) on the first start
  (RegisterStreamConsumer, then DescribeStreamConsumer until it is ACTIVE)
  and subscribes to each shard it holds through it; it never deregisters it.
  A stream has at most 20 consumers (50 in On-demand Advantage mode, per the
  RegisterStreamConsumer reference), a limit the stream's Kinesis queues share.
  Billed per consumer-shard hour and per GB read, on top of the stream.
* MillisBehindLatest: each SubscribeToShard event carries it as a GetRecords
  answer does, so the daemon hands the processors the same figure.
* Coalescing. The daemon calls the processors once per delivery: a poll
  under polling (empty ones every ``idleTimeBetweenReadsInMillis``, which is
  what bounds a small delivery's wait to ``copier.coalesceMillis`` on a shard
  that falls idle), an event of the subscription under fan-out (Kinesis pushes
  one when records arrive; how often it pushes an empty one to an idle shard
  is not documented; kinesis-mock pushes one a second). So under fan-out a
  small delivery can wait for the next event; ``copier.coalesceEvents = 1``
  forwards each delivery at once.
* The IAM role (scripts/copier.yaml, ``RetrievalMode``): fan-out adds
  RegisterStreamConsumer on the stream, DescribeStreamConsumer and
  SubscribeToShard on its consumer; the KCL 3.1.3 makes no other consumer
  call (no ListStreamConsumers, no DeregisterStreamConsumer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

__all__ = ["POLLING_KEYS", "RetrievalMode", "consumer_name", "resolve_mode", "retrieval_summary"]

RetrievalMode = Literal["POLLING", "FANOUT"]

#: ``PollingConfigBean``'s keys: any of them set makes ``DEFAULT`` polling.
POLLING_KEYS = (
    "maxRecords",
    "idleTimeBetweenReadsInMillis",
    "retryGetRecordsInSeconds",
    "maxGetRecordsThreadPool",
    "millisBehindLatestThresholdForReducedTps",
)
CONSUMER_LIMIT = 20  # registered consumers a stream may have (shared with its Kinesis queues)


def _polling_key_set(raw: Mapping[str, str]) -> bool:
    """As ``anyPropertiesSet``: a key given with a value the bean keeps (the primitive ones, when not 0)."""
    for key in POLLING_KEYS:
        value = raw.get(key, "").strip()
        if value and (key in ("retryGetRecordsInSeconds", "maxGetRecordsThreadPool") or value.lstrip("+-0") != ""):
            return True
    return False


def resolve_mode(raw: Mapping[str, str]) -> RetrievalMode:
    """The mode the daemon runs in with these properties (see the module docstring); a value the daemon
    refuses is ``copier.core.kclkeys``' to report, and reads here as ``DEFAULT``."""
    given = raw.get("retrievalMode", "").strip().upper()
    if given in ("POLLING", "FANOUT"):
        return "POLLING" if given == "POLLING" else "FANOUT"
    return "POLLING" if _polling_key_set(raw) else "FANOUT"


def consumer_name(raw: Mapping[str, str], application_name: str) -> str:
    """The consumer the daemon registers under fan-out: ``fanoutConfig.consumerName``, by default
    ``applicationName`` (the KCL 3.1.3 daemon reads its fan-out keys only with that prefix)."""
    return raw.get("fanoutConfig.consumerName", "").strip() or application_name


def retrieval_summary(mode: RetrievalMode, stream: str, consumer: str, explicit: bool) -> str:
    """What the mode means for this application, for ``copier check-config``."""
    how = "" if explicit else " (no retrievalMode = POLLING|FANOUT: the daemon's DEFAULT picks it; say which)"
    if mode == "POLLING":
        return (
            f"retrieval POLLING{how}: the daemon reads {stream} with GetRecords, sharing each shard's 5 reads a "
            "second and 2 MiB/s with every other reader of it (another application, copier status, a load before "
            "a start); no registered consumer, no fan-out charges"
        )
    return (
        f"retrieval FANOUT{how}: the daemon registers the consumer {consumer} on {stream} and reads each shard "
        "over SubscribeToShard, its own 2 MiB/s per shard about 70 ms after the write, leaving the shared 5 reads "
        f"a second to other readers; the consumer counts against the stream's limit of {CONSUMER_LIMIT} consumers "
        "(50 on an On-demand Advantage stream; shared with its Kinesis queues), is billed per consumer-shard hour "
        "and per GB read, and is not deregistered when "
        "the application stops (DeregisterStreamConsumer it when the application is retired); maxRecords and "
        "idleTimeBetweenReadsInMillis are not used, and a delivery held for coalescing waits for the next event "
        "of the subscription (copier.coalesceEvents = 1: none waits)"
    )
