"""What ``copier check-config`` and ``copier run`` find wrong in a properties file beyond its values.

``copier.core.config`` validates what copier reads. The daemon reads the same
file its own way, and ignores what it does not know: a misspelt KCL key
(``maxRecrods``) is silently dropped, a key given twice silently takes the
later value, and ``executableName`` is only tried when the daemon starts a
processor, a minute in. So, before the JVM starts:

* a key given twice is an error (which of the two was meant?);
* a key neither copier nor the KCL MultiLangDaemon 3.1.3 knows is an error
  when it is close to one that they know ("did you mean ..."), a warning
  otherwise (it is ignored);
* a KCL key's value must parse as the daemon's type for it
  (``copier.core.kclkeys``): the daemon reads a number it cannot parse as 0;
* ``executableName`` must name a program that exists and runs, and, when it
  passes ``--properties``, this same file (else the daemon and its
  processors run with different settings). Without ``--properties`` the
  processors read the file ``copier run`` was given (``copier.kcl.daemon``),
  so ``executableName = copier process`` is right in any copy of a file.

Pure but for ``which`` and ``is_executable``, which the caller may replace.
"""

from __future__ import annotations

import difflib
import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from copier.core.kclkeys import KCL_KEYS, kcl_value_problem
from copier.core.properties import parse_properties_all

__all__ = ["KCL_KEYS", "Finding", "close_key", "lint_properties"]



@dataclass(frozen=True)
class Finding:
    """One thing found: ``level`` error (copier run refuses to start) or warning."""

    level: str
    key: str
    line: int
    text: str


def close_key(key: str, known: list[str]) -> str | None:
    """The known key ``key`` is most likely a misspelling of (case aside), or None."""
    lowered = {k.lower(): k for k in known}
    match = difflib.get_close_matches(key.lower(), list(lowered), n=1, cutoff=0.8)
    return lowered[match[0]] if match else None


def lint_properties(
    text: str,
    path: str,
    copier_keys: list[str],
    host: bool = True,
    which: Callable[[str], str | None] = shutil.which,
    is_executable: Callable[[str], bool] = lambda p: os.path.isfile(p) and os.access(p, os.X_OK),
) -> list[Finding]:
    """Everything wrong with the file's keys and (``host``: on this host) its ``executableName``; see the module
    docstring."""
    out: list[Finding] = []
    seen: dict[str, int] = {}
    kcl = {k.lower() for k in KCL_KEYS}
    entries = parse_properties_all(text)
    for number, key, value in entries:
        if key in seen:
            out.append(
                Finding("error", key, number, f"given twice (lines {seen[key]} and {number}): the later wins; keep one")
            )
        seen.setdefault(key, number)
        if key.lower() in kcl:
            problem = kcl_value_problem(key, value)
            if problem is not None:
                out.append(Finding("error", key, number, f"{value.strip()!r}: {problem}"))
            continue
        if key.startswith("copier."):
            continue
        guess = close_key(key, [*KCL_KEYS, *copier_keys])
        if guess is not None:
            out.append(Finding("error", key, number, f"unknown key: did you mean {guess}?"))
        else:
            out.append(Finding("warning", key, number, "unknown to copier and to the KCL MultiLangDaemon: ignored"))
    values = {key: (number, value) for number, key, value in entries}  # the last wins, as the daemon reads it
    if host and "executableName" in values:
        number, command = values["executableName"]
        out.extend(_executable(command, number, path, which, is_executable))
    return out


def _executable(
    command: str, number: int, path: str, which: Callable[[str], str | None], is_executable: Callable[[str], bool]
) -> list[Finding]:
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        return [Finding("error", "executableName", number, f"cannot be split into a command line: {exc}")]
    if not argv:
        return [Finding("error", "executableName", number, "is empty")]
    program = argv[0]
    found = program if "/" in program else which(program)
    if found is None or not is_executable(found):
        where = "does not exist or is not executable" if "/" in program else "is not on PATH"
        return [Finding("error", "executableName", number, f"{program} {where}: the daemon could start no processor")]
    if "--properties" in argv[:-1]:
        named = argv[argv.index("--properties") + 1]
        if Path(named).resolve() != Path(path).resolve():
            return [
                Finding(
                    "error",
                    "executableName",
                    number,
                    f"runs processors with --properties {named}, not this file ({path}): the daemon and its "
                    f"processors would run with different settings; on line {number}, leave --properties out "
                    "(copier run gives its processors its own file): executableName = "
                    + " ".join(argv[: argv.index("--properties")] + argv[argv.index("--properties") + 2 :]),
                )
            ]
    return []
