"""A start that cannot reach AWS says why in one line, within seconds, and once per cause under systemd (issue 45).

Measured before: ``copier run`` against a backend that was down took 114 s and wrote 1,437 lines (21 ERROR
records, 1,141 Java stack-frame lines, the AWS SDK's advice to "increase max connections") before the one
useful line; a misspelt region (``us-eest-1``) took 52 s and 1,560 lines, and check-config said
``500: Internal Server Error``. Each test here runs the real ``copier`` command and counts its lines; the
seconds each took are printed (``-s``), and the JVM never starting is what keeps them short.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from copier.core.startfaults import FULL_EVERY_MS, region_note, repeat
from tests.conftest import Pipeline
from tests.support.backend import DUMMY_ENV, ROOT, free_port

COPIER = str(ROOT / ".venv" / "bin" / "copier")
LOCAL = ROOT / "properties" / "local.properties"


def copier(*args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``copier ARGS`` outside systemd (unless ``env`` says otherwise); its result and its seconds."""
    environment = {k: v for k, v in os.environ.items() if k not in ("INVOCATION_ID", "JOURNAL_STREAM")}
    started = time.monotonic()
    result = subprocess.run(
        [COPIER, *args], capture_output=True, text=True, env={**environment, **DUMMY_ENV, **env}, timeout=300
    )
    return result, time.monotonic() - started


def lines_of(result: subprocess.CompletedProcess[str]) -> list[str]:
    return result.stdout.splitlines() + result.stderr.splitlines()


def sample(tmp_path: Path, endpoint: str | None, region: str = "us-east-1") -> Path:
    """properties/local.properties against ``endpoint`` (None: AWS's own endpoints) in ``region``."""
    path = tmp_path / "copier.properties"
    out = []
    for line in LOCAL.read_text().splitlines():
        key = line.split("=", 1)[0].strip()
        if key == "executableName":
            line = f"executableName = {COPIER} process --properties {path}"
        elif key in ("kinesisEndpoint", "dynamoDBEndpoint"):
            if endpoint is None:
                continue
            line = f"{key} = {endpoint}"
        elif key == "regionName":
            line = f"regionName = {region}"
        out.append(line)
    path.write_text("\n".join(out) + "\n")
    return path


def test_a_start_against_a_backend_that_is_not_running_is_one_line_that_asks_if_it_is(tmp_path: Path) -> None:
    """run and check-config: exit 3 with one line naming the endpoint, the region and the keys, asking whether
    the local backend runs (with the command that starts it on that port); the daemon never starts."""
    port = free_port()  # nobody listens there
    props = sample(tmp_path, f"http://127.0.0.1:{port}")
    expected = (
        f"copier: cannot reach Kinesis and DynamoDB at http://127.0.0.1:{port} (region us-east-1, kinesisEndpoint "
        f"and dynamoDBEndpoint in {props}): connection refused: is the local backend running "
        f"(copier local-backend --port {port})?"
    )
    for command in (["run", "--properties", str(props)], ["check-config", str(props)]):
        result, seconds = copier(*command)
        print(f"copier {command[0]} against a stopped backend: {seconds:.1f} s, {len(lines_of(result))} lines")
        assert result.returncode == 3, result.stderr
        assert lines_of(result) == [expected]


def test_a_misspelt_region_against_the_local_backend_says_the_region_not_a_500(pipeline: Pipeline) -> None:
    """The backend serves any region (its streams and tables are simply not there); the line says that neither
    the staging stream nor the state table is in that region and asks about regionName, with the regions it
    resembles, instead of "create it with copier init"."""
    props = pipeline.write_properties()
    props.write_text(props.read_text().replace("regionName = us-east-1", "regionName = us-eest-1"))
    for command in (["run", "--properties", str(props)], ["check-config", str(props)]):
        result, seconds = copier(*command)
        print(f"copier {command[0]} with regionName us-eest-1: {seconds:.1f} s, {len(lines_of(result))} lines")
        assert result.returncode == 3, result.stderr
        # check-config says first what it thinks of the test's file (no shutdownGraceMillis, a short lease)
        (line,) = [line for line in lines_of(result) if not line.startswith("copier: warning: ")]
        assert f"neither the staging stream {pipeline.staging} nor the state table {pipeline.table} exists " in line
        assert f"(region us-eest-1, endpoint {pipeline.endpoint}): is regionName right? " in line
        assert "us-eest-1 is not a region this botocore lists; did you mean us-east-1 or us-west-1?" in line
        assert "500" not in line and "copier init" not in line
        assert "account" not in line, "the local backend has one account, whatever the (dummy) keys"


def test_a_misspelt_region_against_aws_says_its_endpoint_does_not_resolve(tmp_path: Path) -> None:
    """No endpoint keys: AWS's endpoint for us-eest-1 has no address; said in one line with the region's
    likely spelling, before any AWS call."""
    props = sample(tmp_path, None, region="us-eest-1")
    result, seconds = copier("check-config", str(props))
    print(f"check-config with regionName us-eest-1 against AWS: {seconds:.1f} s")
    assert result.returncode == 3, result.stderr
    assert lines_of(result) == [
        "copier: cannot reach Kinesis at https://kinesis.us-eest-1.amazonaws.com (region us-eest-1, AWS's endpoint "
        "for the region): the name kinesis.us-eest-1.amazonaws.com does not resolve: is regionName right? "
        "us-eest-1 is not a region this botocore lists; did you mean us-east-1 or us-west-1?"
    ]


def test_a_region_in_no_aws_partition_is_a_config_error_with_its_line(tmp_path: Path) -> None:
    props = sample(tmp_path, "http://127.0.0.1:1", region="xx-east-1")
    line = next(n for n, text in enumerate(props.read_text().splitlines(), 1) if text.startswith("regionName"))
    result, _ = copier("check-config", str(props))
    assert result.returncode == 2
    assert lines_of(result) == [
        f"copier: {props}:{line}: regionName: xx-east-1 is in none of AWS's partitions (regions look like "
        "us-east-1, eu-west-2, cn-north-1, us-gov-west-1: botocore's partitions.json)"
    ]


def test_under_systemd_a_start_failing_on_the_same_cause_says_it_once_then_one_short_line(tmp_path: Path) -> None:
    """systemd restarts copier every 5 s: 12 starts a minute. Under a service manager (INVOCATION_ID) the first
    failure is said in full, each repeat in one short line naming the first and counting the starts; a start that
    gets through forgets it, so the next failure is said in full again."""
    port = free_port()
    props = sample(tmp_path, f"http://127.0.0.1:{port}")
    systemd = {"INVOCATION_ID": "0123456789abcdef", "CACHE_DIRECTORY": str(tmp_path / "cache")}
    said = [lines_of(copier("check-config", str(props), **systemd)[0]) for _ in range(12)]
    assert [len(lines) for lines in said] == [1] * 12, said
    assert said[0][0].startswith(f"copier: cannot reach Kinesis and DynamoDB at http://127.0.0.1:{port} ")
    for n, (line,) in enumerate(said[1:], 2):
        assert line.startswith(f"copier: start {n} failed as the one at "), line
        assert f" UTC did: cannot reach Kinesis and DynamoDB at http://127.0.0.1:{port} (region us-east-1, " in line
    assert len(said[1][0]) < len(said[0][0])
    assert copier("check-config", "--offline", str(props), **systemd)[0].returncode == 0  # the file is fine
    again = lines_of(copier("run", "--properties", str(props), **systemd)[0])
    assert again == said[0], "after a start that got through, the cause is news again"
    outside = [lines_of(copier("check-config", str(props))[0]) for _ in range(2)]
    assert outside == [said[0], said[0]], "in a terminal every failure is said in full"


def test_the_repeat_rule_says_a_cause_in_full_again_after_ten_minutes() -> None:
    first = repeat(None, "cause A", 1_000)
    assert first.full and first.text == ""
    second = repeat(first.record, "cause A", 6_000)
    assert not second.full and second.text.startswith("start 2 failed as the one at 00:00:01 UTC did: cause A")
    later = repeat(second.record, "cause A", 1_000 + FULL_EVERY_MS)
    assert later.full and later.text == " (the same since 00:00:01 UTC: 3 starts)"
    assert repeat(later.record, "cause A", 2_000 + FULL_EVERY_MS).full is False
    assert repeat(later.record, "cause B", 2_000 + FULL_EVERY_MS).full, "another cause is news"
    long = repeat(repeat(None, "x" * 500 + "\nsecond", 0).record, "x" * 500 + "\nsecond", 1)
    assert long.text.endswith("... (and 1 more lines)") and len(long.text) < 200


@pytest.mark.parametrize(
    ("region", "note"),
    [
        ("us-east-1", None),
        ("us-eest-1", "us-eest-1 is not a region this botocore lists; did you mean us-east-1 or us-west-1?"),
        ("eu-wset-2", "eu-wset-2 is not a region this botocore lists; did you mean eu-west-2?"),
        (
            "ap-southeast-99",
            "ap-southeast-99 is not a region this botocore lists (nor would a region newer than it be)",
        ),
    ],
)
def test_a_region_botocore_does_not_list_is_named_with_what_it_resembles(region: str, note: str | None) -> None:
    from copier.adapters.awsauth import listed_regions

    assert region_note(region, listed_regions()) == note
