"""Validating a properties file into a Config: one clear line for each problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from copier.core.config import DedupKey, load_config, parse_config
from copier.core.errors import ConfigError

BASE = """
applicationName = app
streamName = staging
regionName = us-east-1
copier.targetStreamName = target
copier.dedupKey = json:meta.id
"""


def parse(extra: str = "", base: str = BASE) -> object:
    return parse_config(base + extra, "test.properties")


def problem(extra: str, base: str = BASE) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(extra, base)
    return info.value


def test_defaults_follow_the_documented_values() -> None:
    """Optional keys take the defaults properties/copier.properties documents."""
    c = parse_config(BASE, "f")
    assert c.state_table_name == "app-copier-state"
    assert c.dedup_key == DedupKey("json", ("meta", "id"))
    assert c.lease_millis == c.failover_time_millis == 10000
    assert (c.dedup_window_seconds, c.dedup_window_max_events, c.digest_ttl_hours) == (3600, 5_000_000, 48)
    assert (c.unkeyed_policy, c.put_timeout_millis) == ("forward", 5000)
    assert c.kinesis_endpoint is None and c.dead_letter_stream_name is None


def test_unknown_copier_key_is_rejected_with_the_known_keys() -> None:
    """A typo in a copier.* key is an error, not a silent default."""
    err = problem("copier.dedupkey = partitionKey\n")
    assert (err.path, err.key) == ("test.properties", "copier.dedupkey")
    assert "unknown copier key" in err.problem and "copier.dedupKey" in err.problem


def test_unknown_non_copier_keys_are_left_to_the_daemon() -> None:
    """KCL keys copier does not read are accepted."""
    parse("maxRecords = 500\nretrievalMode = POLLING\n")


@pytest.mark.parametrize(
    "extra,key,fragment",
    [
        ("copier.dedupKey = body\n", "copier.dedupKey", "expected json:<dotted.path> or partitionKey"),
        ("copier.dedupKey = json:\n", "copier.dedupKey", "expected json:"),
        ("copier.leaseMillis = soon\n", "copier.leaseMillis", "expected a whole number"),
        ("copier.dedupWindowSeconds = -1\n", "copier.dedupWindowSeconds", "from 0 to"),
        ("copier.dedupWindowMaxEvents = lots\n", "copier.dedupWindowMaxEvents", "expected a whole number"),
        ("copier.digestTtlHours = 1\n", "copier.digestTtlHours", "does not outlive the dedup window"),
        ("copier.dedupWindowEvents = 100000\n", "copier.dedupWindowEvents", "copier.dedupWindowSeconds"),
        ("copier.unkeyedPolicy = drop\n", "copier.unkeyedPolicy", "expected one of forward, deadletter"),
        ("copier.unkeyedPolicy = deadletter\n", "copier.deadLetterStreamName", "required when"),
        ("copier.targetStreamName = staging\n", "copier.targetStreamName", "must differ from streamName"),
        ("copier.leaseMillis = 2000\n", "copier.leaseMillis", "leaves no time to put"),
        ("kinesisEndpoint = localhost:4566\n", "kinesisEndpoint", "expected an http:// or https:// URL"),
        ("copier.logLevel = LOUD\n", "copier.logLevel", "expected one of"),
    ],
)
def test_malformed_values_name_the_key_and_the_problem(extra: str, key: str, fragment: str) -> None:
    """Each bad value yields one ConfigError naming the file, the line of the value (issue 45: errors about a
    bad key had one, errors about a bad value none), the key and what is wrong; a key the file lacks has no line."""
    err = problem(extra)
    assert err.key == key
    assert fragment in err.problem
    line = len((BASE + extra).splitlines()) if extra.startswith(key + " ") else None
    assert err.line == line
    where = f"test.properties:{line}" if line is not None else "test.properties"
    assert str(err).startswith(f"{where}: {key}: ")


@pytest.mark.parametrize(
    "missing", ["applicationName", "streamName", "regionName", "copier.targetStreamName", "copier.dedupKey"]
)
def test_missing_required_keys(missing: str) -> None:
    """Every required key, when absent, is reported by name."""
    base = "\n".join(line for line in BASE.splitlines() if not line.startswith(missing + " "))
    err = problem("", base)
    assert (err.key, err.problem) == (missing, "required key is missing")


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    """A missing file is reported like any other configuration problem."""
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.properties")
    assert "cannot read the file" in info.value.problem


def test_shipped_properties_files_are_valid() -> None:
    """properties/copier.properties and local.properties pass validation."""
    root = Path(__file__).resolve().parents[1] / "properties"
    for name in ("copier.properties", "local.properties"):
        load_config(root / name)
