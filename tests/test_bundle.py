"""The release bundle (scripts/bundle.py, make dist) and install.sh installing it with no index and no network.

The bundle is built once for the module (about 15 s with pip's cache: the
locked wheels for both architectures, amazon-kclpy's wheel with its jars,
copier's wheel); each install runs offline (in a network namespace of its own
when this user may make one, and always with pip's --no-index).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
UNITS = ("copier.service", "copier-scale-in.service")


bundle = load_script("bundle", "copier_bundle")


def _offline() -> list[str]:
    """A command prefix that takes the network away (unshare -n), when this user may; else nothing."""
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        return ["unshare", "-n"]
    return []


def _install(release: Path, root: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    env["PIP_INDEX_URL"] = "http://127.0.0.1:9/nothing-here"  # were --no-index ignored, pip would fail here
    return subprocess.run(
        [
            *_offline(),
            str(release / "scripts/install.sh"),
            "--bundle",
            str(release),
            "--root",
            str(root),
            "--python",
            sys.executable,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("dist") / "copier-test"
    yield bundle.build(out)


def _copy(release: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "release"
    shutil.copytree(release, copy, symlinks=True)
    return copy


def _relock(release: Path, wheel: Path) -> None:
    """Give ``wheel``'s new SHA-256 to the bundle's lock (a tamperer who rewrote the lock as well)."""
    lock = release / "requirements.lock"
    name, version = bundle._name_version(wheel.name)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    text = re.sub(
        rf"({re.escape(name)}=={re.escape(version)} \\\n    --hash=sha256:)[0-9a-f]+",
        rf"\g<1>{digest}",
        lock.read_text(),
    )
    lock.write_text(text)


@pytest.mark.timeout(600)
def test_the_bundle_installs_offline_twice_and_keeps_the_config(release: Path, tmp_path: Path) -> None:
    """Every wheel from the bundle by hash, the jars checked, the config written once (0640), the units enabled."""
    assert (release / "requirements.lock").read_text().count("--hash=sha256:") >= len(list(release.glob("wheels/*")))
    root = tmp_path / "root"
    first = _install(release, root)
    assert first.returncode == 0, first.stderr
    assert "KCL jars: 79, each with the SHA-256" in first.stderr
    config = root / "etc/copier/copier.properties"
    assert config.read_text() == (ROOT / "properties/copier.properties").read_text()
    assert config.stat().st_mode & 0o777 == 0o640
    config.write_text(config.read_text() + "\n# edited by the operator\n")
    config.chmod(0o644)
    for unit in UNITS:
        assert (root / "etc/systemd/system" / unit).is_file()
        link = root / "etc/systemd/system/multi-user.target.wants" / unit
        assert link.is_symlink() and str(link.readlink()) == f"/etc/systemd/system/{unit}", f"{unit} enabled"

    second = _install(release, root)
    assert second.returncode == 0, second.stderr
    assert "keeping the existing" in second.stderr
    assert config.read_text().endswith("# edited by the operator\n"), "an existing config is never overwritten"
    assert config.stat().st_mode & 0o777 == 0o640, "but always made 0640"
    (launcher,) = (root / "opt/copier/venv/lib").glob("python3*/site-packages/copier/kcl/copier-kcl-launcher.jar")
    assert zipfile.ZipFile(launcher).getinfo("software/amazon/kinesis/multilang/CopierMultiLangDaemon.class")
    copier = root / "opt/copier/venv/bin/copier"
    help_text = subprocess.run([str(copier), "--help"], capture_output=True, text=True, check=True).stdout
    assert "scale-in-watch" in help_text and "configure" in help_text


def test_a_tampered_wheel_is_refused(release: Path, tmp_path: Path) -> None:
    """One byte added to a wheel: pip's --require-hashes refuses it and install.sh says so."""
    copy = _copy(release, tmp_path)
    (wheel,) = copy.glob("wheels/structlog-*.whl")
    with wheel.open("ab") as f:
        f.write(b"\0")
    result = _install(copy, tmp_path / "root")
    assert result.returncode == 1
    assert "DO NOT MATCH THE HASHES" in result.stderr
    assert "pip refused the bundle's wheels" in result.stderr


def test_a_tampered_jar_is_refused_even_with_a_rewritten_wheel_lock(release: Path, tmp_path: Path) -> None:
    """A jar changed inside amazon-kclpy's wheel, the wheel's hash rewritten to match: the jar check stops it."""
    copy = _copy(release, tmp_path)
    (wheel,) = copy.glob("wheels/amazon_kclpy-*.whl")
    rebuilt = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as old, zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_DEFLATED) as new:
        for info in old.infolist():
            data = old.read(info)
            if info.filename.endswith("/amazon-kinesis-client-multilang-3.1.3.jar"):
                data += b"\0"
            new.writestr(info, data)
    shutil.move(rebuilt, wheel)
    _relock(copy, wheel)
    result = _install(copy, tmp_path / "root")
    assert result.returncode == 1, result.stderr
    assert "amazon-kinesis-client-multilang-3.1.3.jar: FAILED" in result.stderr
    assert "the KCL jars in" in result.stderr and "differ from" in result.stderr


def test_the_build_refuses_jars_other_than_the_locked_ones(tmp_path: Path) -> None:
    """What amazon-kclpy's build fetched from Maven Central is checked against scripts/kcl-jars.sha256."""
    lock = tmp_path / "jars.sha256"
    lock.write_text(f"{'0' * 64}  a.jar\n{hashlib.sha256(b'b').hexdigest()}  b.jar\n")
    wheel = tmp_path / "amazon_kclpy-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("amazon_kclpy/jars/a.jar", b"a")
        z.writestr("amazon_kclpy/jars/b.jar", b"b")
        z.writestr("amazon_kclpy/jars/c.jar", b"c")
    with pytest.raises(bundle.BundleError, match=r"a\.jar: SHA-256 .*c\.jar: not in the lock"):
        bundle.check_jars(wheel, lock)


def test_the_build_refuses_a_copier_wheel_without_the_daemon_launcher(tmp_path: Path) -> None:
    """A wheel built before make install compiled the launcher would give hosts the stock daemon, and one with a
    jar compiled from other sources untested code: both refused."""
    wheel = tmp_path / "copier-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("copier/kcl/logback.xml", b"<configuration/>")
    with pytest.raises(bundle.BundleError, match="no copier/kcl/copier-kcl-launcher.jar: run `make install`"):
        bundle.check_launcher(wheel)
    stale = io.BytesIO()
    with zipfile.ZipFile(stale, "w") as jar:
        jar.writestr("META-INF/copier-launcher-sources", "0123456789abcdef\n")
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("copier/kcl/copier-kcl-launcher.jar", stale.getvalue())
    with pytest.raises(bundle.BundleError, match=r"built from other Java sources \(0123456789abcdef\)"):
        bundle.check_launcher(wheel)
    bundle.check_launcher(wheel, expected="0123456789abcdef")


def test_the_lock_pins_every_dependency_for_both_architectures() -> None:
    """scripts/deploy-requirements.lock names each install_requires of setup.cfg, every entry with a hash."""
    lock = (SCRIPTS / "deploy-requirements.lock").read_text()
    locked = bundle._locked(SCRIPTS / "deploy-requirements.lock")
    requires = re.search(r"install_requires =\n((?:    .+\n)+)", (ROOT / "setup.cfg").read_text())
    assert requires is not None
    for spec in requires.group(1).split():
        name = re.split(r"[=<>!~]", spec)[0].lower()
        assert name in locked, f"{name} is not in the deploy lock: run python scripts/bundle.py lock"
    assert lock.count("==") == len(locked) and all("--hash=sha256:" in b for b in lock.split("==")[1:])
    for package in ("aiohttp", "yarl", "multidict", "frozenlist", "propcache"):  # the binary ones
        block = lock.split(f"\n{package}==")[1].split("\n\n")[0].split("==")[0]
        assert block.count("--hash") >= 2, f"{package}: a wheel for each architecture"


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        ([], 2, "--bundle DIR"),
        (["--bundle", "nonexistent"], 1, "is not a release bundle"),
        (["copier-0.1.0.whl"], 2, "unknown argument"),
    ],
)
def test_install_sh_refuses_bad_arguments_clearly(args: list[str], status: int, message: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(SCRIPTS / "install.sh"), *args], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert result.returncode == status and message in result.stderr, result.stderr
