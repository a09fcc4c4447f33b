"""``copier produce`` started outside the source tree, as a user would: its Spark workers find copier.

PySpark's Python workers run ``python3`` from PATH unless told otherwise;
from the repository root they would import copier from the source tree by
accident, which is how a job that fails everywhere else can pass its tests.
This one runs from an empty temporary directory with PYSPARK_PYTHON unset.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from copier.commands.demo import write_input
from copier.local.backend import DUMMY_ENV
from copier.local.multilang import COPIER
from tests.support.backend import client, create_stream, local_backend, read_stream
from tests.support.props import write_properties

pytestmark = [pytest.mark.protocol, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]


def test_produce_runs_from_any_directory_without_pyspark_python(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with local_backend() as endpoint:
        create_stream(client("kinesis", endpoint), "staging-anywhere", 1)
        props = write_properties(tmp_path / "p.properties", endpoint, "staging-anywhere", "target", "anywhere-state")
        ids = write_input(tmp_path / "input", 300, per_file=100, redelivered=0)
        env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
        env.update(DUMMY_ENV, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH="")
        command = [COPIER, "produce", "--properties", str(props), "--input", str(tmp_path / "input")]
        command += ["--checkpoint", str(tmp_path / "checkpoint"), "--once", "--id-column", "eventId"]
        job = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=500)
        assert job.returncode == 0, job.stderr[-3000:]
        written = {r["PartitionKey"] for r in read_stream(client("kinesis", endpoint), "staging-anywhere")}
    assert written == set(ids)


@pytest.mark.timeout(900)
def test_spark_submit_with_the_wheel_where_copier_is_not_installed(tmp_path: Path) -> None:
    """As on a cluster: a Python environment with only pyspark and boto3, the job shipped as a wheel."""
    cluster = tmp_path / "cluster-python"
    subprocess.run([sys.executable, "-m", "venv", str(cluster)], check=True, timeout=120)
    python = cluster / "bin" / "python"
    pins = [f"pyspark=={version('pyspark')}", f"boto3=={version('boto3')}"]
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *pins], check=True, timeout=600)
    assert subprocess.run([str(python), "-c", "import copier"], cwd=tmp_path, capture_output=True).returncode != 0
    dist = tmp_path / "dist"
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(dist)]
    subprocess.run([*build, str(ROOT)], check=True, timeout=300)
    (wheel,) = dist.glob("copier-*.whl")
    # Spark's Python workers import --py-files ending in .zip, .egg or .jar, not .whl (measured: with the
    # .whl the driver imports copier and every task fails with ModuleNotFoundError). A wheel is a zip.
    shipped = shutil.copy(wheel, dist / (wheel.stem + ".zip"))
    with local_backend() as endpoint:
        create_stream(client("kinesis", endpoint), "staging-cluster", 1)
        props = write_properties(tmp_path / "p.properties", endpoint, "staging-cluster", "target", "cluster-state")
        ids = write_input(tmp_path / "input", 300, per_file=100, redelivered=0)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "VIRTUAL_ENV", "PYTHONPATH"))}
        env.update(DUMMY_ENV, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=str(python))
        env["PATH"] = f"{cluster / 'bin'}:{env['PATH']}"
        command = [str(cluster / "bin" / "spark-submit"), "--master", "local[2]", "--py-files", str(shipped)]
        command += [
            str(ROOT / "scripts" / "produce.py"),
            "--properties",
            str(props),
            "--input",
            str(tmp_path / "input"),
        ]
        command += ["--checkpoint", str(tmp_path / "checkpoint"), "--once", "--id-column", "eventId"]
        job = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert job.returncode == 0, job.stderr[-3000:]
        written = {r["PartitionKey"] for r in read_stream(client("kinesis", endpoint), "staging-cluster")}
    assert written == set(ids)
