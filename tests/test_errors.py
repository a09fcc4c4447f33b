"""AWS errors are mapped to copier's tree at the edge, keeping the AWS error code."""

from __future__ import annotations

import botocore.exceptions
import pytest

from copier.adapters.aws import convert_aws_error
from copier.core.errors import CopierError, FatalAwsError, TransientAwsError


def client_error(code: str, status: int = 400) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op"
    )


@pytest.mark.parametrize(
    "code", ["ResourceNotFoundException", "AccessDeniedException", "ValidationException", "KMSAccessDeniedException"]
)
def test_errors_retrying_cannot_fix_are_fatal(code: str) -> None:
    """A missing resource, denied access or a bad request is fatal, with its code kept."""
    error = convert_aws_error("PutRecords", client_error(code))
    assert isinstance(error, FatalAwsError) and isinstance(error, CopierError)
    assert (error.code, error.retryable) == (code, False)


@pytest.mark.parametrize(
    "code,host_wide",
    [
        ("ResourceNotFoundException", True),
        ("AccessDeniedException", True),
        ("KMSAccessDeniedException", True),
        ("ValidationException", False),
        ("InvalidArgumentException", False),
    ],
)
def test_only_faults_every_shard_shares_end_the_process(code: str, host_wide: bool) -> None:
    """A missing resource or denied access fails every shard alike; a rejected request concerns one shard."""
    error = convert_aws_error("PutRecords", client_error(code))
    assert isinstance(error, FatalAwsError) and error.host_wide is host_wide


@pytest.mark.parametrize(
    "exc",
    [
        client_error("ProvisionedThroughputExceededException"),
        client_error("ThrottlingException"),
        client_error("InternalServerError", 500),
        botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
    ],
)
def test_throttling_server_and_connection_errors_are_transient(exc: Exception) -> None:
    """Throttling, a 5xx and a connection failure are retried."""
    error = convert_aws_error("GetItem", exc)
    assert isinstance(error, TransientAwsError) and error.retryable


def test_a_dropped_connection_inside_a_pynamodb_error_is_transient() -> None:
    """PynamoDB wraps a connection closed mid-PutItem without an AWS answer; it is retried, not a crash.

    (PynamoDB's own cause_response_code raises AttributeError on such an error: the chaos proxy found it.)
    """
    from pynamodb.exceptions import PutError

    closed = botocore.exceptions.ConnectionClosedError(endpoint_url="http://127.0.0.1:1/")
    error = convert_aws_error("PutItem", PutError("Failed to put item", cause=closed))
    assert isinstance(error, TransientAwsError) and error.code == "ConnectionClosedError"
