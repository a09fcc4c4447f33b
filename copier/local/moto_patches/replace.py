"""The one way a patch replaces a moto method: only one that exists, so a renamed method fails loudly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["replace"]


def replace(owner: type, name: str, function: Callable[..., Any]) -> None:
    """Replace ``owner.name``, which must exist: a renamed moto method fails loudly, not silently."""
    if not callable(getattr(owner, name, None)):
        raise RuntimeError(f"moto has no {owner.__module__}.{owner.__qualname__}.{name} to patch")
    setattr(owner, name, function)
