"""The one exception tree of copier.

Every error copier raises on purpose derives from :class:`CopierError`.
Errors of boto3, botocore, PynamoDB and amazon-kclpy are converted to these
only in the adapter modules (``copier.dynamo``, ``copier.kinesis``), keeping
the AWS error code, so the protocol code decides on copier's own terms::

    CopierError
    ├── ConfigError              a properties file is missing a key or has a bad value
    ├── FencedError              another processor took the shard over (epoch moved on,
    │                            or a successor announced itself)
    ├── AwsError                 an AWS call failed; carries ``code`` and ``retryable``
    │   ├── TransientAwsError    throttling, 5xx, timeouts: retry with backoff
    │   │   └── AmbiguousPutError   a PutRecords whose outcome is unknown: it may
    │   │                           have landed, so it is verified, never resent blindly
    │   └── FatalAwsError        missing table or stream, access denied, bad request:
    │                            retrying cannot help, the process exits
    └── ProtocolError            the MultiLang peer sent something copier cannot act on
"""

from __future__ import annotations

__all__ = [
    "AmbiguousPutError",
    "AwsError",
    "ConfigError",
    "CopierError",
    "FatalAwsError",
    "FencedError",
    "ProtocolError",
    "TransientAwsError",
]


class CopierError(Exception):
    """Root of every error copier raises on purpose."""


class ConfigError(CopierError):
    """A properties file is unusable: names the file, the key and the problem."""

    def __init__(self, path: str, key: str, problem: str) -> None:
        self.path = path
        self.key = key
        self.problem = problem
        super().__init__(f"{path}: {key}: {problem}")


class FencedError(CopierError):
    """This processor no longer owns the shard: forward nothing more."""


class AwsError(CopierError):
    """An AWS call failed; ``code`` is the AWS error code (or the exception name)."""

    retryable = False

    def __init__(self, operation: str, code: str, message: str) -> None:
        self.operation = operation
        self.code = code
        super().__init__(f"{operation} failed: {code}: {message}")


class TransientAwsError(AwsError):
    """Throttling, a 5xx, a timeout: the same call may succeed later."""

    retryable = True


class AmbiguousPutError(TransientAwsError):
    """A put whose outcome is unknown: some or all of its records may have landed."""


class FatalAwsError(AwsError):
    """Retrying cannot help (missing table or stream, access denied, validation)."""


class ProtocolError(CopierError):
    """The MultiLang peer sent something copier cannot act on."""
