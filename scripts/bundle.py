"""The release bundle (make dist): everything a host installs, verified, with no index and no download.

    python scripts/bundle.py build --out dist/copier-VERSION   # make dist
    python scripts/bundle.py lock                              # rewrite scripts/deploy-requirements.lock

``build`` downloads copier's dependencies with ``pip download --require-hashes``
against scripts/deploy-requirements.lock (the hashes of every file, for both
x86_64 and aarch64 hosts with CPython 3.11, reviewed when the lock changes),
builds amazon-kclpy's wheel from its locked sdist (its build fetches the KCL
jars from Maven Central with no checksum: each jar is then checked against
scripts/kcl-jars.sha256, and the build stops on any difference), builds
copier's wheel (with the daemon launcher that make install compiled: the
build stops without it), and writes into the bundle:

- ``wheels/``: every wheel a host installs;
- ``requirements.lock``: each of them with its SHA-256 (``pip install
  --no-index --require-hashes`` installs nothing else);
- ``kcl-jars.sha256``: the jars' SHA-256 (install.sh checks the installed jars);
- the installer, the units, the sample properties, the README.

``lock`` resolves the dependencies afresh (the newest versions setup.cfg
allows) and rewrites scripts/deploy-requirements.lock; review its diff.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "scripts" / "deploy-requirements.lock"
JARS_LOCK = ROOT / "scripts" / "kcl-jars.sha256"
PYTHON_VERSION = "3.11"
PLATFORMS = {
    "x86_64": ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"],
    "aarch64": ["manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64"],
}
LAUNCHER_IN_WHEEL = "copier/kcl/copier-kcl-launcher.jar"
SDISTS = ("amazon-kclpy",)  # built here (no wheel on PyPI)
SHIPPED = (
    "scripts/install.sh",
    "scripts/copier.service",
    "scripts/copier-scale-in.service",
    "scripts/copier.env",
    "scripts/copier-rsyslog.conf",
    "scripts/copier-logrotate",
    "properties/copier.properties",
    "README.md",
)


class BundleError(Exception):
    """A file that is not what the locks say; the message names it."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def _name_version(filename: str) -> tuple[str, str]:
    """``pkg_name-1.0-py3-none-any.whl`` or ``pkg-name-1.0.tar.gz`` -> (normalised name, version)."""
    stem = filename.removesuffix(".whl").removesuffix(".tar.gz").removesuffix(".zip")
    if filename.endswith(".whl"):
        name, version = stem.split("-")[:2]
    else:
        name, version = stem.rsplit("-", 1)
    return re.sub(r"[-_.]+", "-", name).lower(), version


def write_lock(files: list[Path], out: Path, header: str) -> None:
    """A pip requirements file: each name==version with the hashes of all its files."""
    hashes: dict[tuple[str, str], set[str]] = defaultdict(set)
    for f in files:
        hashes[_name_version(f.name)].add(sha256(f))
    lines = [header]
    for (name, version), digests in sorted(hashes.items()):
        lines.append(f"{name}=={version} \\")
        lines.extend(f"    --hash=sha256:{d} \\" for d in sorted(digests)[:-1])
        lines.append(f"    --hash=sha256:{sorted(digests)[-1]}")
    out.write_text("\n".join(lines) + "\n")


def _locked(lock: Path) -> dict[str, str]:
    """name -> version of a lock."""
    return dict(re.findall(r"^([a-z0-9-]+)==(\S+)", lock.read_text(), re.MULTILINE))


def _download_wheels(dest: Path, *args: str) -> None:
    """``pip download`` of wheels only, for each platform of PLATFORMS and CPython PYTHON_VERSION."""
    for tags in PLATFORMS.values():
        platform = [a for t in tags for a in ("--platform", t)]
        _pip(
            "download",
            "--quiet",
            "--only-binary=:all:",
            *platform,
            "--python-version",
            PYTHON_VERSION,
            "--implementation",
            "cp",
            "-d",
            str(dest),
            *args,
        )


def _download(lock: Path, dest: Path) -> None:
    """The locked wheels for every platform, and the locked sdists, each checked against the lock by pip."""
    with tempfile.TemporaryDirectory() as tmp:
        wheels_only = Path(tmp) / "wheels.lock"
        sdists_only = Path(tmp) / "sdists.lock"
        blocks = re.split(r"\n(?=[a-z0-9-]+==)", lock.read_text().split("\n", 1)[1].strip())
        wheels_only.write_text("\n".join(b for b in blocks if b.split("==")[0] not in SDISTS) + "\n")
        sdists_only.write_text("\n".join(b for b in blocks if b.split("==")[0] in SDISTS) + "\n")
        _download_wheels(dest, "--no-deps", "--require-hashes", "-r", str(wheels_only))
        _pip(
            "download",
            "--quiet",
            "--no-deps",
            "--require-hashes",
            "--no-binary=:all:",
            "-d",
            str(dest),
            "-r",
            str(sdists_only),
        )


def check_jars(wheel: Path, jars_lock: Path) -> None:
    """Every jar in amazon-kclpy's wheel has the SHA-256 the lock gives, and no jar is missing or extra."""
    expected = dict(line.split()[::-1] for line in jars_lock.read_text().splitlines() if line.strip())
    found: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.filename.endswith(".jar"):
                found[Path(info.filename).name] = hashlib.sha256(z.read(info)).hexdigest()
    problems = [
        f"{name}: SHA-256 {found[name]}, the lock says {digest}"
        for name, digest in expected.items()
        if name in found and found[name] != digest
    ]
    problems += [f"{name}: missing" for name in expected if name not in found]
    problems += [f"{name}: not in the lock" for name in found if name not in expected]
    if problems:
        raise BundleError(f"{wheel.name}: the KCL jars differ from {jars_lock.name}: " + "; ".join(problems))


def check_launcher(wheel: Path, expected: str | None = None) -> None:
    """copier's wheel must carry the daemon launcher (copier/kcl/launcher.py) compiled from the Java sources
    of this tree (``expected``: their digest) by make install: a host without it runs the stock daemon, whose
    every start and stop pauses shards longer, and a stale one is not the code that was tested."""
    from copier.kcl.launcher import jar_digest, sources_digest

    expected = expected or sources_digest()
    with zipfile.ZipFile(wheel) as z:
        if LAUNCHER_IN_WHEEL not in z.namelist():
            raise BundleError(f"{wheel.name} has no {LAUNCHER_IN_WHEEL}: run `make install` (it compiles it) first")
        with zipfile.ZipFile(io.BytesIO(z.read(LAUNCHER_IN_WHEEL))) as jar:
            built_from = jar_digest(jar)
    if built_from != expected:
        raise BundleError(
            f"{wheel.name}: {LAUNCHER_IN_WHEEL} was built from other Java sources ({built_from}) than "
            f"copier/kcl/java's ({expected}): run `make install` (it recompiles it), then build again"
        )


def build(out: Path, lock: Path = LOCK, jars_lock: Path = JARS_LOCK) -> Path:
    """The bundle directory ``out`` (replaced); returns it."""
    if out.exists():
        shutil.rmtree(out)
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        downloads = Path(tmp)
        _download(lock, downloads)
        for f in downloads.glob("*.whl"):
            shutil.copy(f, wheels)
        for sdist in downloads.glob("*.tar.gz"):
            _pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(sdist))
    (kclpy,) = wheels.glob("amazon_kclpy-*.whl")
    check_jars(kclpy, jars_lock)
    _pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT))
    check_launcher(next(wheels.glob("copier-*.whl")))
    built = sorted(wheels.glob("*.whl"))
    missing = set(_locked(lock)) - {_name_version(w.name)[0] for w in built}
    if missing:
        raise BundleError(f"no wheel for {', '.join(sorted(missing))}")
    write_lock(
        built,
        out / "requirements.lock",
        "# Every wheel of this bundle with its SHA-256: pip install --no-index --require-hashes -r this file",
    )
    shutil.copy(jars_lock, out / "kcl-jars.sha256")
    for name in SHIPPED:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, out / name)
    return out


def relock(lock: Path = LOCK) -> None:
    """Resolve copier's install_requires for every platform afresh and rewrite ``lock``."""
    requires = re.search(r"install_requires =\n((?:    .+\n)+)", (ROOT / "setup.cfg").read_text())
    assert requires is not None
    specs = [line.strip() for line in requires.group(1).splitlines()]
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp)
        kclpy = [s for s in specs if s.split("=")[0] in SDISTS]
        _pip("download", "--quiet", "--no-deps", "--no-binary=:all:", "-d", str(dest), *kclpy)
        rest = [s for s in specs if s not in kclpy] + ["boto3"]  # amazon-kclpy's own dependency
        _download_wheels(dest, *rest)
        write_lock(
            sorted(dest.iterdir()),
            lock,
            "# copier's dependencies for the release bundle (scripts/bundle.py lock; CPython 3.11, x86_64 and "
            "aarch64).",
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bundle.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", type=Path, required=True)
    sub.add_parser("lock")
    args = parser.parse_args(argv)
    try:
        if args.command == "lock":
            relock()
        else:
            print(build(args.out))
    except BundleError as exc:
        print(f"bundle.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
