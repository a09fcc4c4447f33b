"""The process's botocore sessions: one for the host's own credentials, all sharing one data loader.

A botocore session loads what its clients need (the service model, the
endpoint rules, the partitions) once per session. Each ``boto3.Session()``
and each PynamoDB connection makes a session of its own, so a record
processor that built its clients the obvious way (staging, target, the
state table's lean client and PynamoDB's) loaded the Kinesis and DynamoDB
models and the endpoint rules four times over: measured, 74 MB RSS for an
idle ``copier process``, about 28 MB of it those copies (docs/benchmarks.md,
"Memory per shard"). Here every client of the host's credentials comes from
one botocore session, and a session that needs credentials of its own (the
target's assumed role, ``copier.adapters.target``) shares the loader, so each
model is loaded once per process.

Clients are made from the shared session on one thread at a time (botocore's
client creation is not thread-safe): copier makes them at start-up, or
lazily on the processor's one thread.
"""

from __future__ import annotations

import functools

import botocore.session

__all__ = ["host_session", "share_loader"]


@functools.cache
def host_session() -> botocore.session.Session:
    """The process's botocore session with the host's own credentials (the default chain).

    Clients are made from it with an explicit ``region_name``: its own region
    setting is left alone, so that one session serves every region.
    """
    return botocore.session.get_session()


def share_loader(session: botocore.session.Session) -> botocore.session.Session:
    """``session`` with the process's one data loader (models and endpoint rules loaded once); returns it."""
    shared = host_session().get_component("data_loader")
    if session is not host_session() and session.get_component("data_loader") is not shared:
        session.register_component("data_loader", shared)
    return session
