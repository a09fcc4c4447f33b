"""The sample properties work from any copy: ``executableName = copier process`` names neither a path nor a file.

Issue 45: properties/local.properties said ``executableName =
.venv/bin/copier process --properties properties/local.properties``: tied to
the repository root and to its own path, so check-config and run refused a
copy until that line was edited. Now ``copier run`` gives the daemon (and so
each processor it spawns) the file it was given, in ``COPIER_PROPERTIES``,
and its own installation's ``copier`` first on ``PATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from copier.core.config import COPIER_KEYS
from copier.core.propertylint import lint_properties
from copier.kcl.daemon import PROPERTIES_ENV, daemon_env, processor_which
from copier.local.multilang import Processor, event
from tests.conftest import Pipeline
from tests.support.backend import ROOT, read_stream

COPIER = str(ROOT / ".venv" / "bin" / "copier")
SAMPLES = [ROOT / "properties" / "local.properties", ROOT / "properties" / "copier.properties"]


def _no_venv_path() -> dict[str, str]:
    """An environment whose PATH holds no copier (as under systemd, or a shell without the virtualenv)."""
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    return {**os.environ, "PATH": path}


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_a_copy_of_a_sample_passes_the_executable_check_anywhere(sample: Path, tmp_path: Path) -> None:
    """Copied elsewhere, with no copier on PATH: its executableName is this installation's copier, and no
    --properties names another file."""
    env = _no_venv_path()
    assert shutil.which("copier", path=env["PATH"]) is None
    copy = tmp_path / "elsewhere" / "mine.properties"
    copy.parent.mkdir()
    shutil.copy(sample, copy)
    findings = lint_properties(copy.read_text(), str(copy), list(COPIER_KEYS), which=processor_which(env))
    assert [f for f in findings if f.key == "executableName"] == []


def test_the_daemon_gets_the_file_and_this_installations_copier_first() -> None:
    env = daemon_env("properties/local.properties", {"PATH": "/usr/bin", "HOME": "/h"})
    assert env[PROPERTIES_ENV] == str((Path.cwd() / "properties/local.properties").resolve())
    assert env["PATH"].split(os.pathsep) == [str(Path(sys.executable).parent), "/usr/bin"]
    assert shutil.which("copier", path=env["PATH"]) == str(Path(sys.executable).with_name("copier"))
    assert env["HOME"] == "/h", "the rest as it was"


def test_a_file_naming_another_file_is_told_the_line_to_change(tmp_path: Path) -> None:
    """Refused, with the line number and the line to write instead."""
    path = tmp_path / "copier.properties"
    text = "applicationName = a\nexecutableName = /opt/x/copier process --properties /etc/other.properties\n"
    (finding,) = lint_properties(text, str(path), list(COPIER_KEYS), which=lambda p: p, is_executable=lambda p: True)
    assert finding.line == 2
    assert finding.text.endswith(
        "on line 2, leave --properties out (copier run gives its processors its own file): "
        "executableName = /opt/x/copier process"
    )


@pytest.mark.protocol
def test_copier_process_without_properties_reads_the_file_copier_run_names(pipeline: Pipeline) -> None:
    """``copier process`` as the samples' executableName spawns it: the file comes from COPIER_PROPERTIES,
    and the processor takes its shard and forwards."""
    proc = Processor(pipeline.properties, command=[COPIER, "process"], env={PROPERTIES_ENV: str(pipeline.properties)})
    try:
        proc.initialize("shardId-000000000000")
        proc.process([event(1, "a"), event(2, "b")])
        ids = sorted(json.loads(r["Data"])["eventId"] for r in read_stream(pipeline.kinesis, pipeline.target))
        assert ids == ["a", "b"]
        assert proc.close() == 0
    finally:
        proc.kill()


def test_copier_process_with_no_file_at_all_says_where_it_looks() -> None:
    env = {k: v for k, v in os.environ.items() if k != PROPERTIES_ENV}
    result = subprocess.run(
        [COPIER, "process"], capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 2
    assert "give --properties FILE (copier run sets COPIER_PROPERTIES" in result.stderr
    assert result.stdout == "", "stdout is the protocol's"
