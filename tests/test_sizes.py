"""The sizes the package keeps (/work/shared/STYLE.md, the working rules): a module about 450 lines, a class about 300.

Past them a module or a class holds more than one thing to read at once;
issue 43 (item 13) found ``copier/bench/report.py`` at 492 lines and
``DedupWindow`` at 329, and split them along what they hold. "About": a
module may run a little over while it stays one subject (MODULE_LINES).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "copier"
MODULE_LINES = 460
CLASS_LINES = 300


def test_every_module_and_class_keeps_to_the_size_limits() -> None:
    too_long: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(PACKAGE.parent)
        lines = text.count("\n")
        if lines > MODULE_LINES:
            too_long.append(f"{where}: {lines} lines (at most {MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > CLASS_LINES:
                    too_long.append(f"{where}: class {node.name}: {size} lines (at most {CLASS_LINES})")
    assert too_long == [], too_long
