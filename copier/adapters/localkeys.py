"""Keys to sign with on the local backend, so that no command there asks a person for AWS credentials.

The local backend (``copier local-backend``: moto) checks no signature, but
every AWS client signs each request before it sends it, and none sends one
without credentials: botocore raises ``NoCredentialsError``, the KCL's Java
SDK and Spark's Python workers fail the same way (``copier produce`` used to
end after 37 s and a thousand lines of Spark tracebacks, ``copier verify``
with ``ListShards failed: NoCredentialsError``). Someone trying copier on
this machine has no keys to give, and should not need any.

So every command reads its properties file through :func:`command_config`:
when every endpoint the file names is on this machine (a loopback address or
``localhost``) and the environment names no credentials
(``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``), it puts dummy keys into its own
environment. Its clients sign with them, and so does every process it starts
afterwards (the daemon's JVM and its processors, Spark's JVM and Python
workers), which inherit that environment: a command must therefore read its
file before it starts any of them. Credentials already set are used as they
are. Against AWS (an endpoint elsewhere, or none: AWS's own) nothing is ever
set.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import MutableMapping
from urllib.parse import urlsplit

from copier.core.config import Config, load_config

__all__ = ["DUMMY_ENV", "command_config", "on_this_machine", "sign_locally"]

#: Credentials for local runs: the backend checks none, and no real ones belong in a test or a demo.
DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}
# What a command puts in when none are set: the keys alone (the file names the regions; a session token of
# "testing" would travel with real keys someone exports later in the same shell).
_SIGNING = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def _loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def on_this_machine(config: Config) -> bool:
    """Whether every endpoint of ``config`` (Kinesis and DynamoDB, the target's and the state table's) is a
    loopback address: the file is for a local backend. An endpoint left out means AWS's own: False."""
    endpoints = [config.kinesis_endpoint, config.dynamodb_endpoint, config.target_endpoint, config.state_endpoint]
    return all(e is not None and _loopback(e) for e in endpoints)


def sign_locally(config: Config, environ: MutableMapping[str, str] = os.environ) -> bool:
    """Dummy keys into ``environ`` when ``config`` is for a local backend and ``environ`` names no
    credentials; True when it put them there."""
    if not on_this_machine(config) or environ.get("AWS_ACCESS_KEY_ID") or environ.get("AWS_PROFILE"):
        return False
    environ.update({key: DUMMY_ENV[key] for key in _SIGNING})
    return True


def command_config(path: str) -> Config:
    """The properties file at ``path`` read and validated (a ConfigError otherwise), with dummy keys to sign
    with when it is for a local backend and none are set (:func:`sign_locally`)."""
    config = load_config(path)
    sign_locally(config)
    return config
