"""The state table's TTL on ``expires_at``: what every digest batch's expiry relies on.

A digest batch is written with ``expires_at`` set past the last moment
anything can still need it (docs/protocol.md, "Digest lifetime"), and
DynamoDB deletes it only while TTL is enabled on that very attribute.
Without it nothing fails: the batches stay, and the table grows for as long
as copier runs, silently. So:

* ``copier init`` finishes what it starts: after creating the table (or
  finding it), it reads the TTL (DescribeTimeToLive) and enables it on
  ``expires_at`` when it is off (UpdateTimeToLive). PynamoDB's own
  ``create_table`` enables it too, but a failure there used to be reported
  as "CreateTable failed" for a table that existed, and a second ``copier
  init`` then found the table and said nothing of the TTL;
* ``copier check-config`` and ``copier run`` read it and refuse a table
  whose TTL is not on ``expires_at`` (exit 3, as for a missing table).

Every failure names the call that failed (DescribeTimeToLive or
UpdateTimeToLive) with AWS's error code, the table and where it is, what is
left undone, and what to do (:func:`ttl_step`: one place, so that a backend
with a documented step of its own can be given it there).

One backend has no TTL at all: dynalite, the DynamoDB of the independent local backend
(:mod:`copier.local.independent`), answers UpdateTimeToLive with UnknownOperationException and
DescribeTimeToLive with DISABLED. A process told so (``COPIER_LOCAL_BACKEND=independent``) whose endpoints
are all on this machine (loopback) says it and goes on: :func:`local_without_ttl`. Anywhere else, and for
any other answer, nothing changes: an endpoint on AWS is never a loopback address.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import botocore.exceptions

from copier.adapters.aws import convert_aws_error, place
from copier.adapters.localkeys import on_this_machine
from copier.adapters.stateitems import TTL_FIELD
from copier.core.config import Config
from copier.core.errors import AwsError, FatalAwsError, StateTableError

__all__ = [
    "LOCAL_BACKEND_ENV",
    "NO_TTL_HERE",
    "TTL_ATTRIBUTE",
    "local_without_ttl",
    "Ttl",
    "check_ttl",
    "describe_ttl",
    "ensure_ttl",
    "ttl_problem",
    "ttl_step",
]

TTL_ATTRIBUTE = TTL_FIELD  # the attribute every digest batch carries its expiry in
_ON = ("ENABLED", "ENABLING")
# Answers that say the endpoint has no such call: retrying cannot help (a local emulator without TTL).
_UNKNOWN_CALL = ("UnknownOperationException",)
#: The environment variable naming the local backend a process runs against (set by whoever starts both).
LOCAL_BACKEND_ENV = "COPIER_LOCAL_BACKEND"
NO_TTL_HERE = (
    f"TTL on {TTL_ATTRIBUTE}: none, the independent local backend (dynalite) has no UpdateTimeToLive, so digest "
    "batches never expire there (it lives in memory for one run); on AWS copier init enables it"
)


def local_without_ttl(config: Config) -> bool:
    """Whether the state table is on the independent local backend, which has no TTL: said by
    ``COPIER_LOCAL_BACKEND=independent`` and believed only when every endpoint is a loopback address."""
    return os.environ.get(LOCAL_BACKEND_ENV) == "independent" and on_this_machine(config)


@dataclass(frozen=True)
class Ttl:
    """A table's TTL as DescribeTimeToLive reports it."""

    status: str  # ENABLED, ENABLING, DISABLED or DISABLING
    attribute: str | None  # the attribute it is (or was being) enabled on; None when never enabled

    @property
    def on(self) -> bool:
        """Enabled (or being enabled) on the attribute copier writes expiries to."""
        return self.status in _ON and self.attribute == TTL_ATTRIBUTE


def ttl_problem(ttl: Ttl) -> str | None:
    """What is wrong with a table's TTL for copier, in words (None: nothing)."""
    if ttl.on:
        return None
    if ttl.status in _ON:
        return f"its TTL is {ttl.status} on the attribute {ttl.attribute}, not on {TTL_ATTRIBUTE}"
    if ttl.status == "DISABLING":
        return f"its TTL is being disabled (DISABLING, on {ttl.attribute})"
    return f"its TTL is {ttl.status}"


def ttl_step(config: Config, ttl: Ttl | None = None) -> str:
    """What an operator does to get TTL on ``expires_at`` (``ttl``: as found, when it could be read)."""
    table = config.state_table_name
    enable = (
        f"aws dynamodb update-time-to-live --table-name {table} "
        f"--time-to-live-specification Enabled=true,AttributeName={TTL_ATTRIBUTE}"
    )
    if ttl is not None and ttl.status in _ON and not ttl.on:
        return (
            f"a table has one TTL attribute: disable TTL on {ttl.attribute} "
            f"(Enabled=false,AttributeName={ttl.attribute}), then `{enable}` once it is DISABLED"
        )
    if ttl is not None and ttl.status == "DISABLING":
        return f"once it is DISABLED, run `copier init --properties {config.path}` (or `{enable}`)"
    return (
        f"run `copier init --properties {config.path}` with a role allowed dynamodb:UpdateTimeToLive "
        f"(it enables TTL on {TTL_ATTRIBUTE}), or `{enable}`"
    )


def _where(config: Config) -> str:
    return f"the state table {config.state_table_name} ({place(config.region, config.state_endpoint)})"


def _failed(config: Config, operation: str, exc: Exception, what: str) -> AwsError:
    """A failed TTL call as an error naming the call, its code, the table and what is left (``what``)."""
    error = convert_aws_error(operation, exc)
    kind = FatalAwsError if error.code in _UNKNOWN_CALL else type(error)
    said = exc.response.get("Error", {}).get("Message") if isinstance(exc, botocore.exceptions.ClientError) else exc
    text = f"{_where(config)}: {what}: {ttl_step(config)}"
    return kind(operation, error.code, text + (f" (AWS said: {said})" if said else ""))


def describe_ttl(client: Any, config: Config, left: str) -> Ttl:
    """DescribeTimeToLive of the state table (``client``: a botocore DynamoDB client); an AwsError naming the
    call, with ``left`` (what is left undone) said, when it fails."""
    try:
        answer = client.describe_time_to_live(TableName=config.state_table_name)
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        raise _failed(config, "DescribeTimeToLive", exc, left) from exc
    found = answer.get("TimeToLiveDescription", {})
    return Ttl(str(found.get("TimeToLiveStatus", "DISABLED")), found.get("AttributeName"))


def check_ttl(client: Any, config: Config) -> Ttl:
    """The state table's TTL, refused (StateTableError) unless it is on ``expires_at``; a failed call is an
    AwsError that names it (``copier check-config``, ``copier run``)."""
    ttl = describe_ttl(client, config, f"its TTL on {TTL_ATTRIBUTE} cannot be checked")
    problem = ttl_problem(ttl)
    if problem is not None and not (ttl.status == "DISABLED" and local_without_ttl(config)):
        raise StateTableError(
            f"{_where(config)}: {problem} (DescribeTimeToLive), so its digest batches never expire and the table "
            f"grows without end: {ttl_step(config, ttl)}"
        )
    return ttl


def ensure_ttl(client: Any, config: Config, created: bool) -> str:
    """TTL on ``expires_at``, enabled if it is off (``copier init``); what was found or done, in words.
    ``created``: the table was created just now (said in an error: it exists, only the TTL is left)."""
    table = "was created" if created else "exists"
    left = f"it {table}, but whether TTL is on {TTL_ATTRIBUTE} could not be read"
    ttl = describe_ttl(client, config, left)
    if ttl.on:
        return f"TTL on {TTL_ATTRIBUTE}: {ttl.status.lower()}"
    if ttl.status != "DISABLED":  # on another attribute, or being disabled: not copier's to undo
        problem = ttl_problem(ttl)
        raise StateTableError(f"{_where(config)} {table}, but {problem}: {ttl_step(config, ttl)}")
    try:
        client.update_time_to_live(
            TableName=config.state_table_name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
        )
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        if convert_aws_error("UpdateTimeToLive", exc).code in _UNKNOWN_CALL and local_without_ttl(config):
            return NO_TTL_HERE
        left = f"it {table}, but TTL on {TTL_ATTRIBUTE} is not enabled, so its digest batches would never expire"
        raise _failed(config, "UpdateTimeToLive", exc, left) from exc
    return f"TTL on {TTL_ATTRIBUTE}: enabled now" + ("" if created else " (it was off)")
