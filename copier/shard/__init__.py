"""One staging shard's protocol (docs/protocol.md), as parts with one job each (docs/architecture.md).

* ``worker``: :class:`ShardWorker`, the facade whose methods map one to one
  onto the KCL record processor's calls and return what to checkpoint;
* ``session``: what the parts share (the shard, its state item, the dedup
  window) and the discipline of every AWS call (retries, stalls, owner writes
  that renew the lease); ``margins``: the clock margins;
* ``ownership``: takeover, take-back and release of the state item;
* ``inflight``: verifying a chunk an earlier owner left in flight;
* ``history``: the dedup window, rebuilt from digest batches (and ancestors');
  ``prestart``: a new application's start, the IDs of what arrived before it;
* ``guard``: the stream settings watched before each chunk;
* ``pipeline``: a delivery cut into chunks, each planned, recorded, put, committed;
* ``holding``: what a fenced processor holds, and taking the shard back;
* ``coalescing``: small deliveries forwarded together;
* ``endings``: closing the shard at its end.

Every decision is made by the pure modules they call (``copier.core.plan``,
``copier.core.recovery``, ``copier.core.window``); the I/O goes through the ports
(``copier.core.ports``, ``copier.core.state.StateStore``).
"""

from copier.shard.worker import ShardWorker, SystemClock, worker_id

__all__ = ["ShardWorker", "SystemClock", "worker_id"]
