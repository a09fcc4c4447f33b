"""Properties files for tests, pointing at the test backend."""

from __future__ import annotations

from pathlib import Path

COPIER = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "copier"  # what `make install` installs


def write_properties(
    path: Path,
    endpoint: str,
    staging: str,
    target: str,
    table: str,
    failover_ms: int = 3000,
    dynamodb_endpoint: str | None = None,
    **copier: object,
) -> Path:
    """A complete properties file; ``copier`` overrides copier.* keys (camelCase names, None drops a key);
    ``dynamodb_endpoint``: DynamoDB's when it is not ``endpoint`` (the independent backend: two servers)."""
    keys: dict[str, object] = {
        "targetStreamName": target,
        "dedupKey": "json:eventId",
        "stateTableName": table,
        "checkpointIntervalMillis": 0,
        "putTimeoutMillis": 1000,
        "clockSkewMillis": 200,
        "maxBackoffMillis": 200,
        "logLevel": "DEBUG",
    }
    keys.update(copier)
    lines = [
        f"executableName = {COPIER} process --properties {path}",
        "applicationName = copier-test",
        f"streamName = {staging}",
        "regionName = us-east-1",
        f"kinesisEndpoint = {endpoint}",
        f"dynamoDBEndpoint = {dynamodb_endpoint or endpoint}",
        f"failoverTimeMillis = {failover_ms}",
        "isGracefulLeaseHandoffEnabled = false",
    ]
    lines += [f"copier.{k} = {v}" for k, v in keys.items() if v is not None]
    path.write_text("\n".join(lines) + "\n")
    return path
