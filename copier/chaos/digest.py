"""Which copier a result describes: a digest of the source every chaos seed and benchmark runs.

A chaos run's verdict and a benchmark's figures hold for the code they ran on; the digest, stored in
docs/reliability*.json and docs/benchmarks.json, says which, and a resumed run only continues results of
the same digest (``copier.chaos.__main__``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["SOURCE_SUFFIXES", "code_digest"]

SOURCE_SUFFIXES = (".py", ".java", ".xml")  # what copier runs: Python, the daemon launcher, the daemon's logback


def code_digest() -> str:
    """What a seed's verdict depends on: the copier package's source (Python, the daemon's Java launcher, the
    logback configuration) and the pinned versions (setup.cfg).

    ``copier/bench`` is left out: nothing a seed runs imports it.
    """
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    files = sorted(
        p
        for p in package.rglob("*")
        if p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts and p.relative_to(package).parts[0] != "bench"
    )
    for path in [*files, package.parent / "setup.cfg"]:
        if path.is_file():
            digest.update(str(path.relative_to(package.parent)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
