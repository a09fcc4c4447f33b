"""The package's layers (docs/architecture.md, "Layers"): no module imports from a layer above its own.

Read from the source (the AST of every module under ``copier/``), so an
import inside a function counts as much as one at the top. Every module must
be placed in a layer: a module outside the layers' folders fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "copier"

# From the bottom: each layer is a folder of the package (docs/architecture.md, "Layers").
LAYERS: list[tuple[str, set[str]]] = [
    ("core", {"copier", "core"}),
    ("adapters", {"adapters"}),
    ("engine", {"shard"}),
    ("kcl", {"kcl"}),
    ("tools", {"local", "spark"}),
    ("commands", {"commands"}),
    ("harnesses", {"chaos", "bench", "testing"}),
]
RANK = {name: rank for rank, (_, names) in enumerate(LAYERS) for name in names}


def layer_of(module: str) -> int | None:
    """The rank of ``copier.X[.Y...]``: its own entry, else the longest package entry that holds it."""
    if module == "copier":
        return RANK["copier"]
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        name = ".".join(parts[1:n])
        if name in RANK:
            return RANK[name]
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, module: str) -> set[str]:
    """The copier modules a file imports (relative imports resolved against ``module``)."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "copier"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            if base.split(".")[0] == "copier":  # a name imported from a package may be a module of it
                found |= {base} if base != "copier" else {f"copier.{a.name}" for a in node.names}
    return found


def upward_imports() -> tuple[list[str], list[str]]:
    """Imports from a layer above the importer's, and modules placed in no layer."""
    wrong, unplaced = [], []
    names = [name for _, group in LAYERS for name in group]
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        own = layer_of(module)
        if own is None:
            unplaced.append(module)
            continue
        for target in sorted(imports_of(path, module)):
            theirs = layer_of(target)
            if theirs is not None and theirs > own:
                wrong.append(f"{module} ({LAYERS[own][0]}) imports {target} ({LAYERS[theirs][0]})")
    assert len(names) == len(set(names)), "a name placed in two layers"
    return wrong, unplaced


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    wrong, unplaced = upward_imports()
    assert not unplaced, f"modules in no layer (add them to LAYERS and docs/architecture.md): {unplaced}"
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The rule can fail: a core module importing the CLI, a relative import included, is caught."""
    core = tmp_path / "copier" / "core" / "plan.py"
    core.parent.mkdir(parents=True)
    core.write_text(
        "from copier.commands.cli import main\nfrom ..adapters.kinesis import KinesisStreams\n"
        "import copier.core.positions\nfrom copier import commands\n"
    )
    module = "copier.core.plan"
    found = imports_of(core, module)
    assert found == {"copier.commands.cli", "copier.adapters.kinesis", "copier.core.positions", "copier.commands"}
    ranks = {t: layer_of(t) for t in found}
    assert [t for t, r in ranks.items() if r is not None and r > layer_of(module)] != []
    assert layer_of("copier.shard.pipeline") == RANK["shard"] and layer_of("copier.nothing") is None
    assert layer_of("copier") == layer_of("copier.core.plan") == 0
