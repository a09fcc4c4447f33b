"""The moto patch for regions: any region a request is signed for is served, as by any local endpoint.

moto keeps its state per account and region, and refuses a region its own
list lacks with a KeyError deep in the request, which its server answers as
``500 Internal Server Error`` with a traceback on the backend's stderr. A
misspelt ``regionName`` (``us-eest-1``) against the local backend therefore
made ``copier check-config`` say ``500: Internal Server Error`` and the
backend write 148 tracebacks while the KCL's SDK retried (issue 45). Against
a local endpoint the region only names the signing scope: the backend serves
it (moto's own ``MOTO_ALLOW_NONEXISTENT_REGION``, set for this process
alone), and the streams and tables of that region are simply not there, which
copier then says by name. copier itself refuses a region that is in none of
AWS's partitions before any call (``copier.commands.preflight``).
"""

from __future__ import annotations

import moto.core.base_backend

__all__ = ["patch_any_region"]


def patch_any_region() -> None:
    """moto serves a region it does not list instead of failing the request with a 500."""
    if not callable(getattr(moto.core.base_backend, "allow_unknown_region", None)):
        raise RuntimeError("moto has no moto.core.base_backend.allow_unknown_region to patch")
    moto.core.base_backend.allow_unknown_region = lambda: True  # type: ignore[attr-defined]
