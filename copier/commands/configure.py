"""``copier configure``: write the properties file from a deployment's parameters, with no shell in between.

scripts/copier.yaml's user data used to write the file with ``sed``, each
parameter pasted into root's shell: a ``'`` in a value ran as root, and a
newline added a line of its own (an ``executableName`` the daemon would run).
Now the template hands each parameter over base64-encoded (an alphabet that
cannot leave the line it is on), one ``KEY=BASE64`` line each, and this
command decodes them and refuses, before anything is written:

- a key that is not a deployment's to set: only ``applicationName``,
  ``streamName``, ``regionName``, ``workerId`` (the host's EC2 instance ID:
  properties/copier.properties says why), the initial position
  (``initialPositionInStream``, or ``initialPositionInStreamExtended`` for an
  application started at a point in time), ``retrievalMode`` (POLLING or
  FANOUT: ``copier.core.retrieval``) and ``copier.*`` keys (never
  ``executableName`` or another daemon key);
- a value with a control character (a newline among them), a backslash (a
  properties escape or line continuation) or white space at either end;
- a value that breaks its key's rule (``copier.core.config.PATTERNS``, the
  template's AllowedPatterns), and a file that ``copier check-config`` would
  refuse: the result goes through the same ``parse_config`` and lint;
- a result whose keys read back other than asked (nothing added, nothing
  lost: the sample's other keys, ``executableName`` among them, as they were).

The file is written whole or not at all (a temporary file renamed over it),
mode 0640, group ``--group`` when given.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import os
import re
import sys
import tempfile
from pathlib import Path

from copier.core.config import DEFAULTS, PATTERNS, parse_config
from copier.core.properties import parse_properties
from copier.core.propertylint import lint_properties

__all__ = ["add_arguments", "main", "read_parameters", "render", "write_properties"]

DEPLOYMENT_KEYS = (
    "applicationName",
    "streamName",
    "regionName",
    "workerId",
    "initialPositionInStream",
    "initialPositionInStreamExtended",
    "retrievalMode",
    *DEFAULTS,
)
_BAD_CHARACTER = re.compile(r"[\x00-\x1f\x7f\\]")


def _check_value(key: str, value: str) -> None:
    if key not in DEPLOYMENT_KEYS:
        raise ValueError(f"{key!r} is not a key a deployment sets (only {', '.join(DEPLOYMENT_KEYS[:6])}, copier.*)")
    if _BAD_CHARACTER.search(value):
        raise ValueError(f"{key}: a control character or backslash in {value!r}")
    if value != value.strip():
        raise ValueError(f"{key}: white space at the start or end of {value!r}")
    pattern = PATTERNS.get(key)
    if value and pattern is not None and not pattern.match(value):
        raise ValueError(f"{key}: {value!r} does not match {pattern.pattern}")


def read_parameters(text: str) -> dict[str, str]:
    """``KEY=BASE64`` lines (blank lines and ``#`` comments skipped) into checked values; ValueError otherwise."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        key, sep, encoded = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9.]+", key):
            raise ValueError(f"line {number}: expected KEY=BASE64")
        try:
            value = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise ValueError(f"line {number}: {key}: not base64 of UTF-8 text") from None
        if key in out:
            raise ValueError(f"line {number}: {key} given twice")
        _check_value(key, value)
        out[key] = value
    return out


def render(sample: str, parameters: dict[str, str]) -> str:
    """The sample with each parameter's line set (an empty value comments an active line out), or appended."""
    lines = sample.splitlines()
    for key, value in parameters.items():
        _check_value(key, value)
        active = re.compile(rf"^\s*{re.escape(key)}\s*[=:\s]")
        commented = re.compile(rf"^\s*[#!]\s*{re.escape(key)}\s*[=:\s]")
        index = next((i for i, line in enumerate(lines) if active.match(line)), None)
        if index is None and value:
            index = next((i for i, line in enumerate(lines) if commented.match(line)), None)
        if index is None:
            if value:
                lines.append(f"{key} = {value}")
        else:
            lines[index] = f"{key} = {value}" if value else f"#{key} ="
    return "\n".join(lines) + "\n"


def _read_back(sample: str, parameters: dict[str, str], text: str) -> None:
    """Every key reads back as asked: the parameters' values, the sample's other keys unchanged."""
    expected = {k: v for k, (_, v) in parse_properties(sample).items() if k not in parameters}
    expected.update({k: v for k, v in parameters.items() if v})
    got = {k: v for k, (_, v) in parse_properties(text).items()}
    if got != expected:
        changed = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
        raise ValueError(f"the written file would not read back as asked: {', '.join(changed)}")


def write_properties(out: Path, text: str, group: str | None = None) -> None:
    """Replace ``out`` with ``text`` at once, mode 0640 (group ``group`` when given)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o640)
            if group is not None:
                import grp

                os.fchown(f.fileno(), -1, grp.getgrnam(group).gr_gid)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, out)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parameters", metavar="FILE", required=True, help="KEY=BASE64 lines (scripts/copier.yaml)")
    p.add_argument("--sample", metavar="FILE", required=True, help="the sample properties (properties/ in the bundle)")
    p.add_argument("--out", metavar="FILE", required=True, help="the properties file to write (mode 0640)")
    p.add_argument("--group", help="the file's group (the service's, e.g. copier)")


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    try:
        sample = Path(args.sample).read_text(encoding="utf-8")
        parameters = read_parameters(Path(args.parameters).read_text(encoding="utf-8"))
        text = render(sample, parameters)
        _read_back(sample, parameters, text)
    except (OSError, ValueError) as exc:
        print(f"copier configure: {args.parameters}: refused, nothing written: {exc}", file=sys.stderr)
        return 2
    parse_config(text, str(out))  # check-config's rules: a ConfigError here exits 2, nothing written
    findings = lint_properties(text, str(out), list(DEFAULTS), host=False)
    for f in findings:
        sys.stderr.write(f"copier configure: {f.level}: {out}:{f.line}: {f.key}: {f.text}\n")
    if any(f.level == "error" for f in findings):
        print(f"copier configure: refused, nothing written to {out}", file=sys.stderr)
        return 2
    write_properties(out, text, args.group)
    print(f"copier configure: wrote {out} ({len(parameters)} parameters)", file=sys.stderr)
    return 0
