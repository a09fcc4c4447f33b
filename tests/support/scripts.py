"""The repository's scripts/ (outside the copier package, on purpose: the chaos run's code digest is of the code
that runs) loaded as modules, so that their tests call them as functions."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str, module: str | None = None) -> ModuleType:
    """scripts/<name>.py as a module named ``module`` (default ``name``)."""
    spec = importlib.util.spec_from_file_location(module or name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded
