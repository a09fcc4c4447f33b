"""Runtime corrections to moto's Kinesis and DynamoDB models, applied by the local backend.

The copier's exactly-once guarantees are tested against moto. Where moto
disagrees with AWS in a way that the copier or the KCL depends on (shard
lineage after a reshard, the end of a closed shard, per-stream settings the
copier reads), a test could pass locally and the code still be wrong on AWS,
or fail locally for a reason AWS never produces. Each patch replaces one moto
method at runtime (site-packages is never edited), says what moto gets wrong
and why the copier needs it right, and is proven by
``tests/test_backend_conformance.py``, which runs on moto and on the second
backend (kinesis-mock and dynalite, :mod:`copier.local.independent`).

The patches are written against moto's internals at the pinned version
(:data:`SUPPORTED_MOTO_VERSION`, from setup.cfg); :func:`apply` refuses any
other version rather than silently patching code it was not checked against.
moto's models are process-wide, so the patches are too: apply them once per
process, before the first request. Each module of this package holds the
patches of one concern:

* :mod:`~copier.local.moto_patches.resharding`: routing, MergeShards, reading a closed shard.
* :mod:`~copier.local.moto_patches.stream_settings`: record size limits, record distribution strategy.
* :mod:`~copier.local.moto_patches.regions`: a region moto does not list served, not answered with a 500.

The audit of issue 46 (each patch removed alone, the conformance suite and the copier tests that exercise
its behaviour run on moto; the second backend measured; AWS's API reference as the judge):

======================================== =============================================================================
patch, verdict                           why; which backend matches AWS's documentation
======================================== =============================================================================
``patch_routing``: kept                  moto routes writes to a closed parent and answers a shard's last hash
                                         key with a 500 (3 conformance checks fail). AWS: a closed shard takes
                                         no new record (the KCL ends it, then leases its children).
                                         kinesis-mock matches AWS.
``patch_merge``: kept                    moto copies both parents' records into the child (the KCL reads each
                                         twice), merges closed shards and mis-checks adjacency. AWS: the child
                                         starts empty. kinesis-mock matches AWS. Only the chaos suite merges
                                         (not run in this audit), so no copier test has shown it unnecessary.
``patch_get_records``: kept              moto never ends a closed shard (no ChildShards, always an iterator):
                                         the KCL never reaches SHARD_END and ``tests/test_chaos_check.py``
                                         fails; it also holds a page to AWS's 10 MiB. kinesis-mock matches AWS.
``patch_record_limits``: kept            moto has no UpdateMaxRecordSize (1 MiB fixed) and
                                         ``tests/test_stream_settings.py`` fails. AWS: a limit per stream,
                                         1,024 to 10,240 KiB. kinesis-mock 0.6.2 enforces the limits as AWS
                                         does but reports ``MaxRecordSizeInKiB`` null until it is set.
``patch_record_distribution``: kept      moto has no RecordDistributionStrategy: the check-config, redrive
                                         and chaos-check tests of AUTO fail. AWS documents it (for on-demand
                                         streams only; this emulation lets a provisioned stream switch too).
                                         kinesis-mock lacks it.
``patch_any_region``: kept               moto answers a region it does not list with a 500 and
                                         ``tests/test_failed_start.py`` (issue 45) fails. AWS has no endpoint
                                         for such a region at all; kinesis-mock and dynalite serve every
                                         region from one state.
``patch_split``: removed                 moto empties the parent and re-puts its records into the children under
                                         new sequence numbers. AWS: a split moves no data; kinesis-mock matches
                                         AWS. Without the patch only that conformance check fails (it now runs
                                         on kinesis-mock alone): the reshard tests and the two-worker end-to-end
                                         test pass, as a child inherits its parent's dedup window and drops the
                                         re-put copies the KCL delivers again.
``patch_sequence_numbers``: removed      moto numbers each shard from 1 (a child's records sort below its
                                         parent's) and moves StartingSequenceNumber to the first record. AWS:
                                         numbers grow over time, a child's above its parents'; kinesis-mock
                                         matches AWS. Nothing in copier or the KCL compares numbers across
                                         shards (a position is a shard's), and the backend's request lock
                                         (``copier.local.backend``), not the patch, keeps concurrent writers'
                                         records: without it the conformance suite's other checks, the reshard
                                         tests and the two-worker end-to-end test (SIGKILL, split, ``copier
                                         verify`` clean) pass.
``patch_duplicate_gsi_create``: removed  moto answers UpdateTable creating an index that exists with a 500;
                                         the patch made that a success AWS never gives (AWS: a 4xx). dynalite
                                         cannot add an index to an on-demand table at all. Without the patch
                                         the two KCL workers of the end-to-end test race, one loses an
                                         initialisation to the 500, retries, finds the index, and the test
                                         passes.
======================================== =============================================================================
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import moto

from copier.local.moto_patches.regions import patch_any_region
from copier.local.moto_patches.resharding import patch_get_records, patch_merge, patch_routing
from copier.local.moto_patches.stream_settings import patch_record_distribution, patch_record_limits

__all__ = ["SUPPORTED_MOTO_VERSION", "apply", "applied"]

SUPPORTED_MOTO_VERSION = "5.2.5"

PATCHES: tuple[Callable[[], None], ...] = (
    patch_routing,
    patch_merge,
    patch_get_records,
    patch_record_limits,
    patch_record_distribution,
    patch_any_region,
)

_apply_lock = threading.Lock()
_applied = False


def applied() -> bool:
    """Whether :func:`apply` has run in this process."""
    return _applied


def apply() -> None:
    """Apply every patch once per process; later calls do nothing.

    Raises RuntimeError if the installed moto is not the version the patches
    were written and tested against.
    """
    global _applied
    with _apply_lock:
        if _applied:
            return
        if moto.__version__ != SUPPORTED_MOTO_VERSION:
            raise RuntimeError(
                f"copier.local.moto_patches supports moto {SUPPORTED_MOTO_VERSION}, found {moto.__version__}: "
                "re-check the patches against the new moto and run tests/test_backend_conformance.py"
            )
        for patch in PATCHES:
            patch()
        _applied = True
