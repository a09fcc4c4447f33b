"""The one place botocore and PynamoDB errors become copier errors, keeping the AWS error code.

Adapter modules (``copier.adapters.dynamo``, ``copier.adapters.kinesis``, ``copier.adapters.streamreader``)
call :func:`convert_aws_error` at their edge, so everything above them
decides on copier's own terms (``copier.core.errors``): retry a transient error,
stall one shard on a fatal one, exit the process on a host-wide one.
"""

from __future__ import annotations

import botocore.exceptions
from pynamodb.exceptions import PynamoDBException

from copier.adapters.awserrors import FATAL_CODES, naming_the_resource, place
from copier.core.errors import AwsError, FatalAwsError, TransientAwsError

__all__ = ["FATAL_CODES", "convert_aws_error", "naming_the_resource", "place", "pynamodb_code"]


def pynamodb_code(exc: PynamoDBException) -> tuple[str | None, str | None]:
    """The AWS error code and message behind a PynamoDB error, or (None, None).

    PynamoDB's own ``cause_response_code`` raises AttributeError when the
    cause is a botocore error without an answer (a dropped connection).
    """
    response = getattr(exc.cause, "response", None)
    error = response.get("Error", {}) if isinstance(response, dict) else {}
    return error.get("Code"), error.get("Message")


def convert_aws_error(operation: str, exc: BaseException) -> AwsError:
    """Map a botocore/PynamoDB failure to copier's tree, keeping the AWS error code.

    Anything without a code (a connection error, a timeout) is transient.
    """
    code: str | None = None
    message = str(exc)
    if isinstance(exc, PynamoDBException):
        code, text = pynamodb_code(exc)
        message = text or message
        cause = exc.cause
        if code is None and cause is not None and cause is not exc:
            return convert_aws_error(operation, cause)
    elif isinstance(exc, botocore.exceptions.ClientError):
        code = exc.response.get("Error", {}).get("Code")
        message = exc.response.get("Error", {}).get("Message", message)
    if code is None:
        return TransientAwsError(operation, type(exc).__name__, message)
    if code in FATAL_CODES:
        return FatalAwsError(operation, code, message)
    return TransientAwsError(operation, code, message)
