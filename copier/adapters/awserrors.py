"""What copier says about an AWS error, without botocore: the codes retrying cannot fix, and a missing
resource named where an operator looks for it.

Kept apart from ``copier.adapters.aws`` (which maps botocore's and PynamoDB's
exceptions) so that a record processor on the lean path (``copier.adapters.awsauth``)
never imports botocore.
"""

from __future__ import annotations

from copier.core.errors import HOST_WIDE_CODES, AwsError, FatalAwsError

__all__ = ["FATAL_CODES", "RETRIED_CODES", "naming_the_resource", "place"]

#: Codes that retrying cannot fix: host-wide ones, and requests AWS rejects as malformed.
FATAL_CODES = HOST_WIDE_CODES | {"ValidationException", "SerializationException", "InvalidArgumentException"}

#: Error answers botocore's standard retry mode retries (throttling and transient codes); any other answer is
#: the caller's to act on at once (an expired iterator wants a new one, not the same request again).
RETRIED_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
        "RequestTimeout",
        "RequestTimeoutException",
        "KMSThrottlingException",
    }
)


def naming_the_resource(error: AwsError, what: str, where: str, step: str) -> AwsError:
    """A missing resource said as an operator needs it: which one (``what``), where (region, endpoint) and
    what to do (``step``); AWS's own message ("Requested resource not found") names none of them."""
    if error.code != "ResourceNotFoundException":
        return error
    said = error.message  # the operation and code are the new error's own: not said twice
    return FatalAwsError(error.operation, error.code, f"{what} does not exist ({where}): {step} (AWS said: {said})")


def place(region: str, endpoint: str | None) -> str:
    """Where a call goes, for a message: the region, and the endpoint when it is not AWS's own."""
    return f"region {region}" + (f", endpoint {endpoint}" if endpoint else "")
