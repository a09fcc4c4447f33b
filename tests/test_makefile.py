"""The Makefile's installs: the demo's installs what the demo needs, and nothing is installed with sudo unsaid.

Issue 45: ``make install`` ran ``sudo apt-get install`` for systemd and
faketime without a word, and installed checkov, which only the tests use.
Now ``make install`` (what ``make demo`` runs) installs copier, the local
backend and PySpark, and ``make install-test`` (what ``make test``, ``make
lint`` and ``make chaos`` run) the rest, saying what and why before it
installs anything from the system's packages. Read with ``make -n -B``
(every recipe listed, none run), and the system-package step run for real
against stand-ins for ``apt-get``, ``sudo`` and ``id``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.backend import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is what CI runs; without it, no Makefile")


def _recipes(target: str, tmp_path: Path) -> str:
    """What ``make TARGET`` would run from nothing (a virtualenv that does not exist yet), run nowhere."""
    result = subprocess.run(
        ["make", "-n", "-B", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_demos_install_installs_what_the_demo_needs_and_nothing_of_the_tests(tmp_path: Path) -> None:
    install = _recipes("install", tmp_path)
    assert "pip install --quiet -e '.[local,spark]'" in install
    assert "copier.kcl.launcher --build" in install
    for test_only in ("apt-get", "sudo", "checkov", ",test"):
        assert test_only not in install, test_only
    assert "install-test" not in _recipes("demo", tmp_path)


def test_make_test_and_lint_install_what_the_tests_need(tmp_path: Path) -> None:
    """CI runs make lint, then make test, in a fresh clone: each installs what it uses."""
    test = _recipes("test", tmp_path)
    assert "'.[local,spark,test,lint,bench]'" in test and "checkov==" in test and "apt-get install" in test
    assert "'.[local,spark,test,lint,bench]'" in _recipes("lint", tmp_path)


def _stand_ins(tmp_path: Path, uid: int) -> dict[str, str]:
    """A PATH whose apt-get, sudo and id only say they ran (and as whom), with make and a shell besides."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "apt-get": 'echo "apt-get ran: $*"',
        "sudo": 'echo "sudo ran: $*"; [ "$1" = -n ] && shift; "$@"',
        "id": f"echo {uid}",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    for program in ("make", "sh", "env", "find"):
        found = shutil.which(program)
        if found and not (bin_dir / program).exists():
            (bin_dir / program).symlink_to(found)
    return {**os.environ, "PATH": str(bin_dir)}


@pytest.mark.parametrize("uid", [0, 1000], ids=["root", "user"])
def test_system_packages_are_said_before_apt_get_or_sudo_runs(tmp_path: Path, uid: int) -> None:
    """A program the tests need is missing: one line says what the tests need and why, one the very commands
    (with sudo -n, which never waits for a password, when not root), and only then do they run."""
    result = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "test-programs", "TEST_PROGRAMS=no-such-program-here:somepackage"],
        capture_output=True,
        text=True,
        env=_stand_ins(tmp_path, uid),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    sudo = "sudo -n " if uid else ""
    said = [
        "make install-test: the tests need systemd-analyze (Debian's systemd: it checks copier's systemd units) "
        "and faketime (libfaketime: the chaos tests run processors on skewed clocks)",
        f"make install-test: installing the Debian packages somepackage: {sudo}apt-get update; "
        f"{sudo}apt-get install -y somepackage",
    ]
    install = ["apt-get ran: update -q", "apt-get ran: install -y -q somepackage"]
    if uid:
        install.insert(0, "sudo ran: -n apt-get update -q")
        install.insert(2, "sudo ran: -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -q somepackage")
    assert result.stdout.splitlines() == said + install


def test_nothing_is_installed_when_the_programs_are_there(tmp_path: Path) -> None:
    result = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "test-programs", "TEST_PROGRAMS=sh:dash"],
        capture_output=True,
        text=True,
        env=_stand_ins(tmp_path, 1000),
        timeout=60,
    )
    assert (result.returncode, result.stdout) == (0, "")
