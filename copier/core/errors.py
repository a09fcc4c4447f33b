"""The one exception tree of copier.

Every error copier raises on purpose derives from :class:`CopierError`.
Errors of boto3, botocore, PynamoDB and amazon-kclpy are converted to these
only in the adapter modules (``copier.adapters.dynamo``, ``copier.adapters.kinesis``), keeping
the AWS error code, so the protocol code decides on copier's own terms::

    CopierError
    ├── ConfigError              a properties file is missing a key or has a bad value
    ├── FencedError              another processor took the shard over (epoch moved on,
    │                            or a successor announced itself)
    ├── AwsError                 an AWS call failed; carries ``code`` and ``retryable``
    │   ├── TransientAwsError    throttling, 5xx, timeouts: retry with backoff
    │   │   └── AmbiguousPutError   a PutRecords whose outcome is unknown: it may
    │   │                           have landed, so it is verified, never resent blindly
    │   └── FatalAwsError        retrying cannot help. ``host_wide`` ones (a missing
    │                            table or stream, denied access, bad credentials, a KMS
    │                            key) fail every shard alike: the process exits and
    │                            its supervisor restarts the daemon. The others (AWS
    │                            rejects one shard's request) stall that shard only:
    │                            it retries slowly and logs, the host's other shards
    │                            go on (one child's exit would restart them all). One
    │                            that blames this host's clock (``copier.core.clockcheck``,
    │                            ``blames_the_clock``) stalls every shard instead: the
    │                            clock is named, and the shards go on once it is right
    ├── EndpointUnreachable      an endpoint a start needs did not answer a connection (refused,
    │                            a name that does not resolve, no answer): said before any call
    ├── IncompatibleStateError   the state table was written by another copier format
    ├── StateTableError          the state table is not as ``copier init`` makes it (its
    │                            TTL is not on ``expires_at``: digest batches never expire)
    ├── ProtocolError            the MultiLang peer sent something copier cannot act on
    └── PlanError                ``copier plan`` cannot plan the workload it was given (a bad value,
                                 an unreadable file, no instance type that holds a shard)
"""

from __future__ import annotations

__all__ = [
    "ENTRY_CODES",
    "NOT_WRITTEN_ENTRY_CODES",
    "AmbiguousPutError",
    "AwsError",
    "ConfigError",
    "CopierError",
    "EndpointUnreachable",
    "FatalAwsError",
    "FencedError",
    "HOST_WIDE_CODES",
    "IncompatibleStateError",
    "PlanError",
    "ProtocolError",
    "StateTableError",
    "TransientAwsError",
]


class CopierError(Exception):
    """Root of every error copier raises on purpose."""


class ConfigError(CopierError):
    """A properties file is unusable: names the file, the line when one is to blame, the key and the problem
    (``key`` "" or "-": the file as a whole, named alone)."""

    def __init__(self, path: str, key: str, problem: str, line: int | None = None) -> None:
        self.path = path
        self.key = key
        self.problem = problem
        self.line = line
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {key}: {problem}" if key not in ("", "-") else f"{where}: {problem}")


class EndpointUnreachable(CopierError):
    """An endpoint ``copier run`` or ``check-config`` needs did not answer; the message is the whole line
    (``copier.core.startfaults.unreachable_text``)."""


class FencedError(CopierError):
    """This processor no longer owns the shard: forward nothing more."""


class AwsError(CopierError):
    """An AWS call failed; ``code`` is the AWS error code (or the exception name)."""

    retryable = False

    def __init__(self, operation: str, code: str, message: str) -> None:
        self.operation = operation
        self.code = code
        self.message = message  # AWS's own words: some codes mean different things (a signature expired, or not)
        super().__init__(f"{operation} failed: {code}: {message}")


class TransientAwsError(AwsError):
    """Throttling, a 5xx, a timeout: the same call may succeed later."""

    retryable = True


class AmbiguousPutError(TransientAwsError):
    """A put whose outcome is unknown: some or all of its records may have landed."""


#: Error codes that no shard on the host can get past: the process exits on them.
HOST_WIDE_CODES = frozenset(
    {
        "ResourceNotFoundException",
        "AccessDeniedException",
        "AccessDenied",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "InvalidSignatureException",
        "IncompleteSignature",
        "MissingAuthenticationTokenException",
        "ExpiredTokenException",
        "KMSAccessDeniedException",
        "KMSDisabledException",
        "KMSInvalidStateException",
        "KMSNotFoundException",
        "KMSOptInRequired",
    }
)


#: The per-entry ``ErrorCode``s of a PutRecords answer that prove the entry was not written: throttling refuses
#: an entry before it is written. AWS documents one other (PutRecordsResultEntry): ``InternalFailure``, "Internal
#: Service Failure", an unknown error inside the service, the per-entry kin of a 500 answer. Nothing in AWS's
#: documentation says such an entry was not written, so it, and any code AWS does not document, is an unknown
#: outcome: verified by reading the stream before it is sent again (docs/protocol.md, "Assumptions").
NOT_WRITTEN_ENTRY_CODES = frozenset({"ProvisionedThroughputExceededException"})
#: Every per-entry code AWS documents; another one is taken as AWS refusing the entry (a record over the
#: stream's limit, say), which a re-plan may get past and which otherwise stalls the shard.
ENTRY_CODES = NOT_WRITTEN_ENTRY_CODES | {"InternalFailure"}


class FatalAwsError(AwsError):
    """Retrying cannot help (missing table or stream, access denied, validation)."""

    @property
    def host_wide(self) -> bool:
        """True when every shard on the host fails alike (see the module docstring)."""
        return self.code in HOST_WIDE_CODES


class IncompatibleStateError(CopierError):
    """The state table holds items of another copier format: this version cannot read them."""


class StateTableError(CopierError):
    """The state table exists but is not as ``copier init`` makes it: the message says what and what to do."""


class ProtocolError(CopierError):
    """The MultiLang peer sent something copier cannot act on."""


class PlanError(CopierError):
    """``copier plan`` cannot plan the workload it was given: the message says what to change."""
