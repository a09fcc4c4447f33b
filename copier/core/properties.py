"""Reading Java ``.properties`` files, the format the KCL MultiLangDaemon reads.

The daemon and copier share one file, so copier must read it the way
``java.util.Properties.load`` does: ``#`` and ``!`` comments, ``=``, ``:`` or
white space between key and value, a trailing backslash continuing a line,
and backslash escapes. The last occurrence of a key wins, as in Java.
"""

from __future__ import annotations

__all__ = ["parse_properties", "parse_properties_all"]

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join continued lines; return (first physical line number, logical line)."""
    out: list[tuple[int, str]] = []
    pending: str | None = None
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.lstrip() if pending is not None else raw
        if pending is None:
            stripped = line.lstrip()
            if not stripped or stripped[0] in "#!":
                continue
            start = number
            line = stripped
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending = (pending or "") + line[:-1]
            continue
        out.append((start, (pending or "") + line))
        pending = None
    if pending is not None:
        out.append((start, pending))
    return out


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and i + 6 <= len(text):
                try:
                    out.append(chr(int(text[i + 2 : i + 6], 16)))
                    i += 6
                    continue
                except ValueError:
                    pass
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _split(line: str) -> tuple[str, str]:
    """Split a logical line at the first unescaped ``=``, ``:`` or white space."""
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "=: \t\f":
            break
        i += 1
    key, rest = line[:i], line[i:]
    rest = rest.lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return _unescape(key), _unescape(rest)


def parse_properties(text: str) -> dict[str, tuple[int, str]]:
    """Parse properties text into ``{key: (line number, value)}``; last key wins."""
    return {key: (number, value) for number, key, value in parse_properties_all(text)}


def parse_properties_all(text: str) -> list[tuple[int, str, str]]:
    """Every (line number, key, value) in file order, a key given twice twice (``copier.core.propertylint``)."""
    return [(number, *_split(line)) for number, line in _logical_lines(text)]
