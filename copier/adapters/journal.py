"""Lines for the systemd journal: the syslog priority prefix journald reads when stderr is the journal.

journald files a stderr line that starts with ``<N>`` at priority N (and
strips the prefix; ``SyslogLevelPrefix=`` defaults to yes), so
``journalctl -u copier -p warning`` can show warnings and errors alone. The
prefix is written only when stderr *is* the journal: in a terminal, a pipe
or a file it would be noise.
"""

from __future__ import annotations

import os
import sys

__all__ = ["DEBUG", "ERROR", "INFO", "LEVELS", "WARNING", "journal_wanted", "say"]

ERROR, WARNING, INFO, DEBUG = 3, 4, 6, 7
LEVELS = {"error": ERROR, "warning": WARNING, "info": INFO, "debug": DEBUG}


def journal_wanted(fd: int = 2) -> bool:
    """Is ``fd`` the systemd journal's stream? (``JOURNAL_STREAM`` names its device and inode; a stderr
    redirected elsewhere by the unit or a shell keeps the variable but not the file, and gets no prefixes.)"""
    value = os.environ.get("JOURNAL_STREAM", "")
    try:
        device, inode = (int(part) for part in value.split(":"))
        status = os.fstat(fd)
    except (ValueError, OSError):
        return False
    return (status.st_dev, status.st_ino) == (device, inode)


def say(text: str, level: str = "info") -> None:
    """One ``copier: ...`` line on stderr at ``level`` (error, warning, info, debug)."""
    prefix = f"<{LEVELS[level]}>" if journal_wanted() else ""
    sys.stderr.write(f"{prefix}copier: {text}\n")
