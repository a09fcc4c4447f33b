"""The chaos harness runs its workers with settings `copier check-config` accepts: a put timeout its backend
answers within, and a lease that outlives a put, the clock margin and a renewal (copier.core.configwarnings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from copier.chaos.harness import BACKEND_TIMING, seed_copier, seed_kcl
from copier.chaos.schedule import PROFILES
from copier.core.config import load_config
from copier.core.configwarnings import config_warnings, lease_floor
from copier.local.pipeline import local_properties

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("backend", sorted(BACKEND_TIMING))
def test_every_seed_worker_holds_a_lease_check_config_accepts(tmp_path: Path, backend: str) -> None:
    skews = {skew for profile in PROFILES.values() for skew in profile.clock_skews_ms}
    for skew in sorted(skews):
        path = local_properties(
            tmp_path / f"{backend}-{skew}.properties",
            "http://127.0.0.1:1",
            "timing",
            "staging",
            "target",
            "copier",
            kcl=seed_kcl(backend),
            deadLetterStreamName="dlq",
            **{**seed_copier(backend), "clockSkewMillis": str(skew)},
        )
        config = load_config(path)
        assert config.lease_millis >= lease_floor(config), (backend, skew, config.lease_millis, lease_floor(config))
        assert not [w for w in config_warnings(config) if "lease" in w.lower()], config_warnings(config)


@pytest.mark.parametrize("backend", sorted(BACKEND_TIMING))
def test_each_backend_gets_a_put_timeout_above_the_slowest_put_it_answered_in_a_published_run(backend: str) -> None:
    runs = [json.loads(p.read_text()) for p in sorted((ROOT / "docs").glob("reliability*.json"))]
    slowest = [s["slowest_put_ms"] for run in runs for s in run["results"] if s.get("backend") == backend]
    assert slowest, f"no published seed ran on {backend}"
    assert BACKEND_TIMING[backend]["putTimeoutMillis"] > max(slowest)
