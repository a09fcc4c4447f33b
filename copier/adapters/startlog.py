"""What a failed ``copier run`` or ``copier check-config`` says, said once per cause under a service manager.

systemd starts copier again 5 s after a failed start, for ever (scripts/copier.service): the unit's
``ExecStartPre`` runs ``copier check-config`` and ``ExecStart`` runs ``copier run``. A start that fails
on the same cause each time would say it in full 12 times a minute. When a service manager runs copier
(``INVOCATION_ID``, which systemd sets for every process of a service), the last failure is kept in a
small file beside the daemon's class-data archive (the unit's ``CacheDirectory``, else the user's cache),
one per properties file, and a repeat says one short line (``copier.core.startfaults.repeat``); a start
that gets through removes the file. In a terminal every failure is said in full, every time.

Nothing here may stop a start: a record that cannot be read or written only means the cause is said in full.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from copier.adapters.journal import say
from copier.core.startfaults import repeat

__all__ = ["StartLog", "record_dir"]


def record_dir(env: Mapping[str, str]) -> Path | None:
    """Where the record lives: systemd's CacheDirectory (the first it names), else ``$XDG_CACHE_HOME/copier``
    or ``~/.cache/copier``; None when there is none."""
    if env.get("CACHE_DIRECTORY"):
        return Path(env["CACHE_DIRECTORY"].split(":")[0])
    base = env.get("XDG_CACHE_HOME") or (str(Path(env["HOME"]) / ".cache") if env.get("HOME") else "")
    return Path(base) / "copier" if base else None


class StartLog:
    """The failures of one properties file's starts (``failed``), and a start that got through (``passed``)."""

    def __init__(self, properties: str, env: Mapping[str, str] = os.environ) -> None:
        directory = record_dir(env) if env.get("INVOCATION_ID") else None
        digest = hashlib.sha256(str(Path(properties).resolve()).encode()).hexdigest()[:16]
        self.path = None if directory is None else directory / f"start-failure-{digest}.json"

    def failed(self, lines: Sequence[tuple[str, str]]) -> None:
        """Say why the start failed: ``lines`` of (text, level), in full, or as one short line when they are
        what the last failed start said (see the module docstring)."""
        if self.path is None:
            self._say_all(lines, "")
            return
        cause = "\n".join(text for text, _ in lines)
        said = repeat(self._read(), cause, time.time_ns() // 1_000_000)
        if said.full:
            self._say_all(lines, said.text)
        else:
            say(said.text, _worst(lines))
        self._write(said.record)

    def passed(self) -> None:
        """The start got through: a failure after it is news again."""
        if self.path is not None:
            try:
                self.path.unlink(missing_ok=True)
            except OSError:
                pass

    @staticmethod
    def _say_all(lines: Sequence[tuple[str, str]], tail: str) -> None:
        for n, (text, level) in enumerate(lines, 1):
            say(text + (tail if n == len(lines) else ""), level)

    def _read(self) -> dict[str, object] | None:
        assert self.path is not None
        try:
            record = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def _write(self, record: dict[str, object]) -> None:
        assert self.path is not None
        pending = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            pending.write_text(json.dumps(record), encoding="utf-8")
            pending.replace(self.path)
        except OSError:
            pass


def _worst(lines: Sequence[tuple[str, str]]) -> str:
    order = ("error", "warning", "info", "debug")
    return min((level for _, level in lines), key=lambda level: order.index(level), default="error")
