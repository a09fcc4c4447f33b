"""How copier reaches the target (and dead-letter) stream: region, endpoint, and an assumed role.

A target in another account or region (data sharing, disaster recovery) is
reached with ``copier.targetRegionName`` and ``copier.targetRoleArn``: the
host's own credentials (the instance role) call STS AssumeRole, and the
target's clients sign with the role's temporary credentials. Those are
botocore's own refreshing credentials (``DeferredRefreshableCredentials``
over an ``AssumeRoleCredentialFetcher``): they assume the role on first use
and again whenever the session is within botocore's refresh window of its
expiry (15 minutes), under a lock, so no call is ever signed with expired
credentials and no timer of copier's own is involved. The STS endpoint is
the source region's (``AWS_ENDPOINT_URL_STS`` overrides it, as for any
botocore client).

Every call to the target goes through this session: puts, the reads that
verify a put after a crash, the shard map, and ``copier verify``.
"""

from __future__ import annotations

import functools
from typing import Any

import botocore.exceptions
import botocore.session
from botocore.credentials import AssumeRoleCredentialFetcher, DeferredRefreshableCredentials

from copier.adapters.aws import convert_aws_error
from copier.adapters.awserrors import RETRIED_CODES
from copier.adapters.sessions import host_session, share_loader
from copier.core.config import Config
from copier.core.errors import FatalAwsError, TransientAwsError
from copier.core.streamsettings import open_shards

__all__ = ["check_target", "target_session"]


def target_session(config: Config) -> botocore.session.Session:
    """The botocore session the target's clients come from (made with ``region_name=config.target_region``):
    the host's own (``copier.adapters.sessions``), or one with the assumed role's credentials when one is
    configured (sharing the host session's loaded models)."""
    if config.target_role_arn is None:
        return host_session()
    source = host_session()
    extra: dict[str, Any] = {
        "RoleSessionName": config.target_role_session_name,
        "DurationSeconds": config.target_role_session_seconds,
    }
    if config.target_external_id is not None:
        extra["ExternalId"] = config.target_external_id
    source_credentials = source.get_credentials()
    if source_credentials is None:
        raise FatalAwsError("AssumeRole", "NoCredentials", "no credentials to assume copier.targetRoleArn with")
    fetcher = AssumeRoleCredentialFetcher(
        client_creator=functools.partial(source.create_client, region_name=config.region),
        source_credentials=source_credentials,
        role_arn=config.target_role_arn,
        extra_args=extra,
    )
    role = share_loader(botocore.session.Session())
    role._credentials = DeferredRefreshableCredentials(  # botocore has no public setter for credentials objects
        refresh_using=fetcher.fetch_credentials, method="assume-role"
    )
    return role


def check_target(config: Config) -> str:
    """Assume the role (if any) and describe the target stream; a line saying so, or AwsError.

    Run by ``copier check-config`` and before ``copier run`` starts the
    daemon, so that a role that cannot be assumed, or a target that the role
    cannot see, fails at once with one line instead of in every processor.
    """
    session = target_session(config)
    client = session.create_client("kinesis", region_name=config.target_region, endpoint_url=config.target_endpoint)
    who = f"as {config.target_role_arn}" if config.target_role_arn else "with the host's credentials"
    try:
        summary = client.describe_stream_summary(StreamName=config.target_stream_name)["StreamDescriptionSummary"]
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        error = convert_aws_error("DescribeStreamSummary", exc)
        # A throttle (the account's 20 DescribeStreamSummary a second, at a fleet's start) or a 5xx passes: the
        # start goes on and the processors read the target as they forward. Anything else (a role that cannot
        # be assumed, an STS that does not answer, a stream the role cannot see) fails the start in one line.
        answered = isinstance(exc, botocore.exceptions.ClientError)
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)) if answered else 0
        passing = answered and (error.code in RETRIED_CODES or status >= 500)
        kind = TransientAwsError if passing else FatalAwsError
        raise kind(
            error.operation,
            error.code,
            f"target stream {config.target_stream_name} in {config.target_region}, {who}: {exc}",
        ) from exc
    encryption = summary.get("EncryptionType", "NONE")
    key = f", encrypted with {summary['KeyId']}" if encryption == "KMS" and summary.get("KeyId") else ""
    return (
        f"target {config.target_stream_name} in {config.target_region} reachable {who}: "
        f"{summary.get('StreamStatus', '?')}, {open_shards(summary.get('OpenShardCount'))}{key}"
    )
