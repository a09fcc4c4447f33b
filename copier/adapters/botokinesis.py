"""Kinesis through botocore, for a process that is not on the lean path (``copier.adapters.awsauth``).

``copier.adapters.kinesis.KinesisStreams`` imports this only when it uses
botocore: a lean record processor never loads it.

A put's deadline on this path (taken where a proxy applies to the target,
``copier.adapters.awsjson.usable``) holds as far as botocore lets a caller
bound a call: the deadline is checked before the credentials are asked for
and again in botocore's ``before-send`` event, after signing (a credential
refresh) and before the first byte is written, so a put that would start
late is never sent (a not-sent TransientAwsError, safe to retry); its
connect is bounded by the put timeout. What remains, and the lean client
(``copier.adapters.httpwire``) does not leave: a name lookup has no timeout;
the read timeout bounds each socket operation, not the body's whole sending;
urllib3 closes a connection it gave up on normally, so bytes still in the
kernel's send queue go on leaving; and a proxy forwards the request when it
can, which nothing on this host bounds.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Sequence
from typing import Any

import botocore.config
import botocore.exceptions
import botocore.session

from copier.adapters.aws import convert_aws_error
from copier.adapters.clockhooks import watch_botocore
from copier.adapters.kinesisanswers import put_results
from copier.core.clockcheck import ClockBounds
from copier.core.errors import AmbiguousPutError, TransientAwsError

__all__ = ["botocore_client", "put_records"]

_NOT_SENT = (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError)
_AMBIGUOUS = (
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectionClosedError,
    botocore.exceptions.ResponseStreamingError,
)
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("copier_put_deadline", default=None)


class _DeadlinePassed(Exception):
    """Raised in ``before-send``: the put's deadline passed before its first byte was written."""


def _check_deadline(**_: Any) -> None:
    """``before-send`` of PutRecords: refuse to send once the put's deadline has passed (returns None: sent)."""
    deadline = _DEADLINE.get()
    if deadline is not None and time.monotonic() >= deadline:
        raise _DeadlinePassed("the put's deadline passed before it was sent (after signing)")


def botocore_client(
    session: botocore.session.Session,
    region: str,
    endpoint: str | None,
    *,
    attempts: int | None,
    read_timeout: float,
    clock_bounds: ClockBounds | None = None,
    put_deadlines: bool = False,
) -> Any:
    """A Kinesis client; its answers feed ``clock_bounds`` when given (``copier.adapters.clockhooks``).

    ``put_deadlines``: the put client (see the module docstring): its connect bounded by ``read_timeout``,
    and each PutRecords checked against the deadline :func:`put_records` gives it before it is sent.
    """
    retries: dict[str, Any] = {"mode": "standard"}
    if attempts is not None:
        retries["total_max_attempts"] = attempts
    connect = min(5.0, read_timeout) if put_deadlines else 5.0
    client = session.create_client(
        "kinesis",
        region_name=region,
        endpoint_url=endpoint,
        config=botocore.config.Config(retries=retries, connect_timeout=connect, read_timeout=read_timeout),  # type: ignore[arg-type]
    )
    if put_deadlines:
        client.meta.events.register_last("before-send.kinesis.PutRecords", _check_deadline, unique_id="copier-deadline")
    return client if clock_bounds is None else watch_botocore(client, clock_bounds)


def put_records(
    client: Any, stream: str, entries: Sequence[tuple[str, bytes, str | None]], deadline: float | None = None
) -> list[str | None]:
    """One PutRecords attempt through a client that makes one attempt (see ``copier.adapters.kinesis``), not
    sent once ``deadline`` (``time.monotonic()``) has passed."""
    if deadline is not None and time.monotonic() >= deadline:
        raise TransientAwsError("PutRecords", "DeadlinePassed", "the put's deadline passed before it was sent")
    request = [{"PartitionKey": pk, "Data": data} for pk, data, _ in entries]
    token = _DEADLINE.set(deadline)
    try:
        answer = client.put_records(StreamName=stream, Records=request)
    except _DeadlinePassed as exc:
        raise TransientAwsError("PutRecords", "DeadlinePassed", str(exc)) from exc
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
    except (AttributeError, TypeError, ValueError, RecursionError) as exc:
        # botocore's parser fails so on an answer that is JSON but not an object, or not UTF-8: sent, unknown
        raise AmbiguousPutError("PutRecords", "UnreadableAnswer", repr(exc)[:300]) from exc
    finally:
        _DEADLINE.reset(token)
    try:
        return put_results(answer, len(entries))
    except ValueError as exc:  # an answer that does not say what landed: its outcome is unknown
        raise AmbiguousPutError("PutRecords", "UnreadableAnswer", str(exc)) from exc
