"""Shared fixtures: one local backend per test session, fresh streams and table per test."""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from copier.local.independent import ENV_MARK, Endpoints, servers
from copier.local.multilang import Processor
from tests.support.backend import DUMMY_ENV, ROOT, client, create_stream, local_backend
from tests.support.props import write_properties

# No property test may fail for the machine's speed (a loaded CI machine took 285 ms over Hypothesis' 200 ms
# deadline in tests/test_window.py): no deadline, and no health check about slow data generation.
settings.register_profile("copier", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("copier")

for _k, _v in DUMMY_ENV.items():
    os.environ.setdefault(_k, _v)

_names = itertools.count(1)


@pytest.fixture(scope="session")
def endpoint() -> Iterator[str]:
    """The project's local backend (copier local-backend), started for this test run on 127.0.0.1."""
    with local_backend() as url:
        yield url


@pytest.fixture(scope="session")
def independent() -> Iterator[Endpoints]:
    """The second local backend (kinesis-mock and dynalite, copier.local.independent) for this test run,
    on 127.0.0.1; the tests that use it set COPIER_LOCAL_BACKEND=independent for the copier they start."""
    with servers() as endpoints:
        yield endpoints


BACKENDS = ("moto", "independent")


def backend_for(request: pytest.FixtureRequest, impl: str) -> Endpoints:
    """The session's backend ``impl`` (moto: one URL for both services). For the independent one, this test's
    copier (in process and in children) is told so: COPIER_LOCAL_BACKEND=independent (dynalite has no TTL)."""
    if impl == "moto":
        url = request.getfixturevalue("endpoint")
        return Endpoints(url, url, impl="moto")
    request.getfixturevalue("monkeypatch").setenv(ENV_MARK, "independent")
    endpoints: Endpoints = request.getfixturevalue("independent")
    return endpoints


@pytest.fixture(params=BACKENDS)
def backend_endpoints(request: pytest.FixtureRequest) -> Endpoints:
    """Each local backend in turn: moto and the independent one (kinesis-mock and dynalite)."""
    return backend_for(request, request.param)


@dataclass
class Pipeline:
    """A staging stream, a target stream, a state table and a properties file for them."""

    endpoint: str
    staging: str
    target: str
    table: str
    properties: Path
    kinesis: Any
    dynamodb: Any
    tmp: Path

    def write_properties(self, **copier: object) -> Path:
        return write_properties(self.properties, self.endpoint, self.staging, self.target, self.table, **copier)

    def init(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(ROOT / ".venv/bin/copier"), "init", "--properties", str(self.properties)],
            capture_output=True,
            text=True,
            env={**os.environ, **DUMMY_ENV},
            check=True,
        )


@pytest.fixture
def pipeline(endpoint: str, tmp_path: Path) -> Pipeline:
    """Fresh streams (staging: 1 shard, target: 2 shards) and state table, created through the backend."""
    n = next(_names)
    kinesis = client("kinesis", endpoint)
    p = Pipeline(
        endpoint=endpoint,
        staging=f"staging-{n}",
        target=f"target-{n}",
        table=f"state-{n}",
        properties=tmp_path / "copier.properties",
        kinesis=kinesis,
        dynamodb=client("dynamodb", endpoint),
        tmp=tmp_path,
    )
    create_stream(kinesis, p.staging, 1)
    create_stream(kinesis, p.target, 2)
    p.write_properties()
    p.init()
    return p


@pytest.fixture
def processors() -> Iterator[Callable[..., Processor]]:
    """Start ``copier process`` children: ``processors(pipeline, name)``; all are killed after the test."""
    started: list[Processor] = []

    def start(p: Pipeline, name: str = "processor") -> Processor:
        proc = Processor(p.properties, name)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
