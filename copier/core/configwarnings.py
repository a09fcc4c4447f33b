"""Settings copier accepts but that will not hold on a loaded host: said by ``copier check-config``.

The lease rule. Before each put a processor renews its lease unless the
lease outlives the put's timeout plus its clock margin
(``ShardSession.ensure_lease``), and that margin is the larger of
``copier.clockSkewMillis`` and this host's measured clock bound
(``copier.core.clockcheck``), which is about a second wide while only a few
AWS answers have been seen (the ``Date`` header names whole seconds) and on
a host whose round trips are slow. The renewal itself is a DynamoDB write,
which takes up to a second there too, and between two renewals there
should be at least a second to forward in. So::

    leaseMillis >= putTimeoutMillis + max(clockSkewMillis, 1000) + 1000 + 1000

Below it every put waits for a renewal and a slow one lets the lease run
short (seen with properties/local.properties' 3 s lease and 1 s put
timeout on a loaded 2-core machine: a processor reported 136 events as
``possible_duplicates`` although none was duplicated). copier's own
validation (``copier.core.config``) only refuses a lease that leaves no
time at all (``leaseMillis <= putTimeoutMillis + clockSkewMillis``).
"""

from __future__ import annotations

from collections.abc import Mapping

from copier.core.clockcheck import DATE_RESOLUTION_MS
from copier.core.config import Config

__all__ = ["FORWARD_MS", "RENEWAL_MS", "config_warnings", "lease_floor"]

RENEWAL_MS = 1000  # a lease renewal's write on a loaded host
FORWARD_MS = 1000  # time to forward in between two renewals


def lease_floor(config: Config) -> int:
    """The smallest lease that holds on a loaded host (see the module docstring)."""
    return config.put_timeout_millis + max(config.clock_skew_millis, DATE_RESOLUTION_MS) + RENEWAL_MS + FORWARD_MS


def config_warnings(config: Config, lines: Mapping[str, int] | None = None) -> list[str]:
    """What in ``config`` is valid but will not hold, each with the rule and its numbers, at the line of the key
    to change when the file gives it (``lines``: each key's line, as the file was read)."""
    out = []
    floor = lease_floor(config)
    if config.lease_millis < floor:
        skew = config.clock_skew_millis
        where = _at(config.path, lines or {}, "copier.leaseMillis", "failoverTimeMillis")
        out.append(
            f"{where}: the copier lease ({config.lease_millis} ms: copier.leaseMillis, by default "
            f"failoverTimeMillis) is not well above "
            f"copier.putTimeoutMillis + copier.clockSkewMillis: a lease should be at least putTimeoutMillis + "
            f"max(clockSkewMillis, 1000 ms: a clock bound measured from few answers) + 1000 ms (a renewal's write "
            f"on a loaded host) + 1000 ms (to forward in between renewals) = {config.put_timeout_millis} + "
            f"{max(skew, DATE_RESOLUTION_MS)} + {RENEWAL_MS} + {FORWARD_MS} = {floor} ms, or every put waits for "
            f"a renewal and a slow one lets the lease run short; set copier.leaseMillis = {floor} or more"
        )
    return out


def _at(path: str, lines: Mapping[str, int], *keys: str) -> str:
    """``path:line`` of the first of ``keys`` the file gives (the one that sets the value), else ``path``."""
    line = next((lines[key] for key in keys if key in lines), None)
    return path if line is None else f"{path}:{line}"
