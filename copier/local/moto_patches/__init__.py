"""Runtime corrections to moto's Kinesis and DynamoDB models, applied by the local backend.

The copier's exactly-once guarantees are tested against moto. Where moto
disagrees with AWS in a way that the copier or the KCL depends on (shard
lineage after a reshard, the end of a closed shard, unique sequence numbers,
idempotent index creation), a test could pass locally and the code still be
wrong on AWS, or fail locally for a reason AWS never produces. Each patch
replaces one moto method at runtime (site-packages is never edited), says
what moto gets wrong and why the copier needs it right, and is proven by
``tests/test_backend_conformance.py``.

The patches are written against moto's internals at the pinned version
(:data:`SUPPORTED_MOTO_VERSION`, from setup.cfg); :func:`apply` refuses any
other version rather than silently patching code it was not checked against.
moto's models are process-wide, so the patches are too: apply them once per
process, before the first request. Each module of this package holds the
patches of one concern:

* :mod:`~copier.local.moto_patches.sequence_numbers`: unique, increasing sequence numbers.
* :mod:`~copier.local.moto_patches.resharding`: routing, SplitShard, MergeShards, reading a closed shard.
* :mod:`~copier.local.moto_patches.stream_settings`: record size limits, record distribution strategy.
* :mod:`~copier.local.moto_patches.dynamodb`: idempotent index creation.
* :mod:`~copier.local.moto_patches.regions`: a region moto does not list served, not answered with a 500.

Audited against the second backend (kinesis-mock and dynalite, which need none of these): each patch makes
moto do what those independent implementations and AWS's documentation agree on. Removing
``patch_sequence_numbers``, ``patch_split`` and ``patch_duplicate_gsi_create`` together made the full suite
fail (test_scale: a 100,000-event aggregated batch duplicated and the in-flight verification timing out;
chaos smoke seeds 8 and 10 on moto: unexplained copies and events out of order): every patch is kept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import moto

from copier.local.moto_patches.dynamodb import patch_duplicate_gsi_create
from copier.local.moto_patches.regions import patch_any_region
from copier.local.moto_patches.resharding import patch_get_records, patch_merge, patch_routing, patch_split
from copier.local.moto_patches.sequence_numbers import patch_sequence_numbers
from copier.local.moto_patches.stream_settings import patch_record_distribution, patch_record_limits

__all__ = ["SUPPORTED_MOTO_VERSION", "apply", "applied"]

SUPPORTED_MOTO_VERSION = "5.2.5"

PATCHES: tuple[Callable[[], None], ...] = (
    patch_sequence_numbers,
    patch_routing,
    patch_split,
    patch_merge,
    patch_get_records,
    patch_duplicate_gsi_create,
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
