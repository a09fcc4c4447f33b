"""Kinesis through botocore, for a process that is not on the lean path (``copier.adapters.awsauth``).

``copier.adapters.kinesis.KinesisStreams`` imports this only when it uses
botocore: a lean record processor never loads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import botocore.config
import botocore.exceptions
import botocore.session

from copier.adapters.aws import convert_aws_error
from copier.adapters.clockhooks import watch_botocore
from copier.core.clockcheck import ClockBounds
from copier.core.errors import AmbiguousPutError, TransientAwsError

__all__ = ["botocore_client", "put_records"]

_NOT_SENT = (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError)
_AMBIGUOUS = (
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectionClosedError,
    botocore.exceptions.ResponseStreamingError,
)


def botocore_client(
    session: botocore.session.Session,
    region: str,
    endpoint: str | None,
    *,
    attempts: int | None,
    read_timeout: float,
    clock_bounds: ClockBounds | None = None,
) -> Any:
    """A Kinesis client; its answers feed ``clock_bounds`` when given (``copier.adapters.clockhooks``)."""
    retries: dict[str, Any] = {"mode": "standard"}
    if attempts is not None:
        retries["total_max_attempts"] = attempts
    client = session.create_client(
        "kinesis",
        region_name=region,
        endpoint_url=endpoint,
        config=botocore.config.Config(retries=retries, connect_timeout=5, read_timeout=read_timeout),  # type: ignore[arg-type]
    )
    return client if clock_bounds is None else watch_botocore(client, clock_bounds)


def put_records(client: Any, stream: str, entries: Sequence[tuple[str, bytes, str | None]]) -> list[str | None]:
    """One PutRecords attempt through a client that makes one attempt (see ``copier.adapters.kinesis``)."""
    request = [{"PartitionKey": pk, "Data": data} for pk, data, _ in entries]
    try:
        answer = client.put_records(StreamName=stream, Records=request)
    except _NOT_SENT as exc:
        raise TransientAwsError("PutRecords", type(exc).__name__, str(exc)) from exc
    except _AMBIGUOUS as exc:
        raise AmbiguousPutError("PutRecords", type(exc).__name__, str(exc)) from exc
    except botocore.exceptions.ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        err = convert_aws_error("PutRecords", exc)
        if status >= 500:
            raise AmbiguousPutError("PutRecords", err.code, str(exc)) from exc
        raise err from exc
    except botocore.exceptions.BotoCoreError as exc:
        raise AmbiguousPutError("PutRecords", type(exc).__name__, str(exc)) from exc
    return [r.get("ErrorCode") for r in answer["Records"]]
