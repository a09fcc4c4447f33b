"""Reading the KCL's own tables: who holds each lease, and which workers still report.

The KCL 3.x daemon keeps, per application: the lease table (``tableName``,
default ``applicationName``; one item per shard: ``leaseKey`` the shard ID,
``leaseOwner`` the workerId holding it, ``leaseCounter`` bumped by every
renewal, ``checkpoint``), ``<applicationName>-WorkerMetricStats`` (one item
per worker: ``wid``, and ``lut``, the epoch second of its last report,
written every ``workerMetricsReporterFreqInMillis`` whether the worker has
work or not) and ``<applicationName>-CoordinatorState`` (the leader's lock,
the 2.x-to-3.x migration state). copier reads the first two, never writes
them (``copier.core.health`` judges what they say).

Scans, eventually consistent, only the attributes needed: the lease table
holds one small item per shard (about 1 KB with the KCL's own attributes,
which are not read: a Scan page of 1 MB costs 128 read units at most), the
worker table one per worker. The hosts' role may Scan both
(scripts/copier.yaml); so does the KCL's leader, every
``leaseAssignmentIntervalMillis``.
"""

from __future__ import annotations

from typing import Any

from copier.core.config import Config
from copier.core.health import KclLease

__all__ = ["lease_items", "leases", "worker_reports", "worker_table"]


def worker_table(config: Config) -> str:
    """The KCL 3.x worker metrics table of the application (its name is not a MultiLangDaemon key)."""
    return f"{config.application_name}-WorkerMetricStats"


def _client(config: Config) -> Any:
    import boto3

    return boto3.session.Session().client("dynamodb", region_name=config.region, endpoint_url=config.dynamodb_endpoint)


def lease_items(
    config: Config, table: str, names: list[str], limit: int | None = None
) -> tuple[list[dict[str, Any]], bool]:
    """The items of one of the KCL's tables, only the attributes ``names`` (a Scan, followed to its last page
    unless ``limit`` items are read first), and whether that is all of them; an AwsError goes up
    (``ResourceNotFoundException``: no such table)."""
    import botocore.exceptions

    from copier.adapters.aws import convert_aws_error

    client = _client(config)
    kwargs: dict[str, Any] = {
        "TableName": table,
        "ProjectionExpression": ", ".join(f"#a{i}" for i in range(len(names))),
        "ExpressionAttributeNames": {f"#a{i}": name for i, name in enumerate(names)},
    }
    items: list[dict[str, Any]] = []
    while True:
        if limit is not None:
            kwargs["Limit"] = limit - len(items)
        try:
            page = client.scan(**kwargs)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            raise convert_aws_error("Scan", exc) from exc
        items += page.get("Items", [])
        last = page.get("LastEvaluatedKey")
        if last is None:
            return items, True
        if limit is not None and len(items) >= limit:
            return items, False
        kwargs["ExclusiveStartKey"] = last


def _text(item: dict[str, Any], name: str) -> str | None:
    value = item.get(name, {})
    return value.get("S") if isinstance(value, dict) else None


def _number(item: dict[str, Any], name: str) -> int:
    value = item.get(name, {})
    try:
        return int(float(value.get("N", "0"))) if isinstance(value, dict) else 0
    except ValueError:
        return 0


def leases(config: Config) -> dict[str, KclLease]:
    """Every lease of the application's lease table, by lease key (the shard ID)."""
    items, _ = lease_items(config, config.lease_table_name, ["leaseKey", "leaseOwner", "leaseCounter", "checkpoint"])
    return {
        key: KclLease(_text(item, "leaseOwner"), _text(item, "checkpoint") or "", _number(item, "leaseCounter"))
        for item in items
        if (key := _text(item, "leaseKey"))
    }


def worker_reports(config: Config) -> dict[str, int]:
    """Each worker's last report to the WorkerMetricStats table, in epoch ms (``lut`` is in seconds)."""
    items, _ = lease_items(config, worker_table(config), ["wid", "lut"])
    return {wid: _number(item, "lut") * 1000 for item in items if (wid := _text(item, "wid"))}
