"""Fakes shipped with copier: an in-memory state store, a fixed clock, in-memory streams, a flaky Kinesis client.

They run through the same contract tests as the real implementations
(``tests/test_state_contract.py``, ``tests/test_streams_contract.py``), so a
test that passes against a fake exercises the behaviour the real one has.
Import them from here (``from copier.testing import ...``); each lives in a
module of its own:

* :mod:`copier.testing.clock`: :class:`FakeClock`.
* :mod:`copier.testing.store`: :class:`InMemoryStateStore`.
* :mod:`copier.testing.streams`: :class:`InMemoryStreams`, its shards in :mod:`copier.testing.shards`
  (:func:`even_shards`).
* :mod:`copier.testing.flaky`: :class:`FlakyKinesis` for the Spark staging writer
  (:func:`flaky_kinesis`, :func:`read_flaky_log`).
"""

from __future__ import annotations

from copier.testing.clock import FakeClock
from copier.testing.flaky import FlakyKinesis, flaky_kinesis, read_flaky_log
from copier.testing.shards import even_shards
from copier.testing.shards import shards_from as shards_from  # public before the split, outside __all__
from copier.testing.store import InMemoryStateStore
from copier.testing.streams import InMemoryStreams
from copier.testing.streams import PutFault as PutFault  # public before the split, outside __all__

__all__ = [
    "FakeClock",
    "FlakyKinesis",
    "InMemoryStateStore",
    "InMemoryStreams",
    "even_shards",
    "flaky_kinesis",
    "read_flaky_log",
]
