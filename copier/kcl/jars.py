"""The KCL MultiLangDaemon jars that amazon-kclpy installs next to itself.

``python -m copier.kcl.jars --check`` fails loudly when they are missing, which
happens when amazon-kclpy's build could not reach Maven Central.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["jar_dir", "jars"]

MULTILANG_JAR_PREFIX = "amazon-kinesis-client-multilang-"


def jar_dir() -> Path:
    import amazon_kclpy

    return Path(amazon_kclpy.__file__).resolve().parent / "jars"


def jars() -> list[Path]:
    """All jars of the daemon's classpath, sorted for a stable command line."""
    directory = jar_dir()
    return sorted(directory.glob("*.jar")) if directory.is_dir() else []


def main(argv: list[str]) -> int:
    found = jars()
    if not any(p.name.startswith(MULTILANG_JAR_PREFIX) for p in found):
        sys.stderr.write(
            f"copier: the KCL jars are missing from {jar_dir()} (amazon-kclpy could not download them); "
            "reinstall amazon-kclpy with Maven Central reachable, or set KCL_MVN_REPO_SEARCH_URL\n"
        )
        return 1
    if "--check" in argv:
        sys.stderr.write(f"KCL jars: {len(found)} in {jar_dir()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
