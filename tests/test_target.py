"""The target anywhere and in order: another account through an assumed role, KMS errors, per-key order.

The local backend (moto) serves STS and keeps each account's streams apart:
credentials from AssumeRole of a role in account 111111111111 see that
account's streams only. The copier reaches STS through
``AWS_ENDPOINT_URL_STS``, as any botocore client would.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest

from copier.adapters.kinesis import KinesisStreams
from copier.chaos.proxy import FaultProxy, FaultWindow
from copier.core.config import parse_config
from copier.core.errors import ConfigError, FatalAwsError
from copier.local.multilang import COPIER, Processor, records_message
from tests.support.backend import DUMMY_ENV, client, create_stream, local_backend
from tests.support.props import write_properties

OTHER_ACCOUNT = "111111111111"
ROLE = f"arn:aws:iam::{OTHER_ACCOUNT}:role/copier-target"
BASE = "applicationName = app\nstreamName = staging\nregionName = eu-west-1\ncopier.dedupKey = json:eventId\n"
BASE += "copier.targetStreamName = target\n"


# -- configuration ---------------------------------------------------------------------------------------------


def test_the_target_defaults_to_the_staging_region_and_the_hosts_credentials() -> None:
    config = parse_config(BASE)
    assert (config.target_region, config.target_role_arn, config.ordering) == ("eu-west-1", None, "partitionKey")


def test_a_target_role_with_its_options() -> None:
    text = BASE + f"copier.targetRegionName = us-west-2\ncopier.targetRoleArn = {ROLE}\n"
    text += "copier.targetExternalId = shared-7\ncopier.targetRoleSessionSeconds = 900\n"
    config = parse_config(text)
    assert (config.target_region, config.target_role_arn, config.target_external_id) == ("us-west-2", ROLE, "shared-7")
    assert (config.target_role_session_name, config.target_role_session_seconds) == ("copier-app", 900)


@pytest.mark.parametrize(
    ("extra", "key", "message"),
    [
        ("copier.targetRoleArn = arn:aws:iam::1234:role/x\n", "copier.targetRoleArn", "not a valid IAM role ARN"),
        ("copier.targetExternalId = abc\n", "copier.targetExternalId", "needs copier.targetRoleArn"),
        (f"copier.targetRoleArn = {ROLE}\ncopier.targetRoleSessionSeconds = 60\n", "Seconds", "from 900 to 43200"),
        ("copier.targetRegionName = europe\n", "copier.targetRegionName", "not a valid region"),
        ("copier.ordering = key\n", "copier.ordering", "expected one of partitionKey, none"),
    ],
)
def test_bad_target_settings_are_refused(extra: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(BASE + extra)
    assert key in info.value.key and message in info.value.problem


# -- another account, through the role -------------------------------------------------------------------------


def _as_role(endpoint: str, service: str) -> Any:
    """A client in the other account, as the role (what the target's owner sees)."""
    sts = client("sts", endpoint)
    creds = sts.assume_role(RoleArn=ROLE, RoleSessionName="test")["Credentials"]
    return boto3.session.Session(
        aws_access_key_id=creds["AccessKeyId"],
        aws_secret_access_key=creds["SecretAccessKey"],
        aws_session_token=creds["SessionToken"],
        region_name="us-east-1",
    ).client(service, endpoint_url=endpoint)


def _events(first: int, count: int, keys: int = 0) -> list[tuple[str, bytes]]:
    """(partition key, JSON event): distinct keys, or ``keys`` hot ones."""
    return [
        (f"k{(n % keys) if keys else n}", json.dumps({"eventId": f"e{n}", "n": n}).encode())
        for n in range(first, first + count)
    ]


def _read_all(kinesis: Any, stream: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            page = kinesis.get_records(ShardIterator=iterator, Limit=10000)
            out.extend(page["Records"])
            iterator = page.get("NextShardIterator") if page["Records"] else None
    return out


def _assume_role_calls(recording: Path) -> list[dict[str, str]]:
    calls = []
    for line in recording.read_text().splitlines():
        entry = json.loads(line)
        raw = base64.b64decode(entry["body"]) if entry.get("body_encoded") else (entry.get("body") or "").encode()
        text = raw.decode(errors="replace")
        if "Action=AssumeRole" in text:
            calls.append(dict(part.split("=", 1) for part in text.split("&") if "=" in part))
    return calls


def _target_put_keys(recording: Path) -> set[str]:
    """The access key IDs that signed the copier's PutRecords calls."""
    keys = set()
    for line in recording.read_text().splitlines():
        entry = json.loads(line)
        headers = {k.lower(): v for k, v in entry["headers"].items()}
        if headers.get("x-amz-target", "").endswith(".PutRecords"):
            keys.add(headers["authorization"].split("Credential=")[1].split("/")[0])
    return keys


@pytest.mark.protocol
@pytest.mark.timeout(300)
def test_a_target_in_another_account_through_a_role_whose_credentials_refresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every event once in the other account's stream; the role assumed again and again during the run
    (900 s sessions are inside botocore's 15-minute refresh window from the start), never a loss."""
    recording = tmp_path / "recording.jsonl"
    with local_backend(MOTO_ENABLE_RECORDING="True", MOTO_RECORDER_FILEPATH=str(recording)) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", endpoint)
        create_stream(client("kinesis", endpoint), "staging", 1)
        theirs = _as_role(endpoint, "kinesis")
        create_stream(theirs, "shared", 2)
        props = write_properties(
            tmp_path / "p.properties",
            endpoint,
            "staging",
            "shared",
            "xacct-state",
            targetRoleArn=ROLE,
            targetExternalId="shared-7",
            targetRoleSessionSeconds=900,
        )
        env = {**os.environ, **DUMMY_ENV}
        subprocess.run([COPIER, "init", "--properties", str(props)], check=True, capture_output=True, env=env)
        check = subprocess.run([COPIER, "check-config", str(props)], capture_output=True, text=True, env=env)
        assert check.returncode == 0 and f"reachable as {ROLE}" in check.stdout, check.stdout + check.stderr
        proc = Processor(props)
        try:
            proc.initialize("shardId-000000000000")
            recording.write_text("")  # from here on: the copier's own calls
            for batch in range(6):
                events = _events(batch * 100, 100) + _events(batch * 100, 20)  # 20 producer duplicates each
                proc.process_json(records_message(events, 1 + batch * 1000))
            proc.shutdown_requested()
        finally:
            proc.close()
        stored = Counter(json.loads(r["Data"])["eventId"] for r in _read_all(theirs, "shared"))
        assert stored == Counter({f"e{n}": 1 for n in range(600)})
        ours = client("kinesis", endpoint).list_streams()["StreamNames"]
        assert "shared" not in ours, "the target was reached in the other account, not the host's"
        calls = _assume_role_calls(recording)
        assert len(calls) >= 2, "the role's credentials were refreshed during the run"
        assert all(c.get("ExternalId") == "shared-7" and c.get("DurationSeconds") == "900" for c in calls)
        assert len(_target_put_keys(recording)) >= 2, "puts were signed with refreshed credentials"


@pytest.mark.protocol
@pytest.mark.timeout(120)
def _errors(result: subprocess.CompletedProcess[str]) -> list[str]:
    """stderr without the settings warnings (this file keeps the KCL's shutdownGraceMillis default of 0)."""
    return [line for line in result.stderr.splitlines() if not line.startswith("copier: warning: ")]


def test_check_config_says_in_one_line_when_the_target_cannot_be_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing target in the role's account, and an STS that cannot be reached: exit 3, one line."""
    with local_backend() as endpoint:
        props = write_properties(
            tmp_path / "p.properties", endpoint, "staging", "absent", "xacct-t", targetRoleArn=ROLE
        )
        env = {**os.environ, **DUMMY_ENV, "AWS_ENDPOINT_URL_STS": endpoint}
        missing = subprocess.run([COPIER, "check-config", str(props)], capture_output=True, text=True, env=env)
        assert missing.returncode == 3
        assert len(_errors(missing)) == 1 and "ResourceNotFoundException" in missing.stderr
        assert f"absent in us-east-1, as {ROLE}" in missing.stderr
        env["AWS_ENDPOINT_URL_STS"] = "http://127.0.0.1:9"
        no_sts = subprocess.run([COPIER, "check-config", str(props)], capture_output=True, text=True, env=env)
        assert no_sts.returncode == 3 and len(_errors(no_sts)) == 1, no_sts.stderr
        assert ROLE in no_sts.stderr
        offline = subprocess.run(
            [COPIER, "check-config", "--offline", str(props)], capture_output=True, text=True, env=env
        )
        assert offline.returncode == 0, offline.stderr
        run = subprocess.run([COPIER, "run", "--properties", str(props)], capture_output=True, text=True, env=env)
        assert run.returncode == 3 and ROLE in run.stderr, "copier run checks before starting the daemon"


# -- KMS ----------------------------------------------------------------------------------------------------------


class _KmsRefused:
    """A put client that fails as Kinesis does when the role may not use the stream's key (moto cannot)."""

    def put_records(self, **kwargs: Any) -> Any:
        error = {"Code": "KMSAccessDeniedException", "Message": "User is not authorized to use the key."}
        raise botocore.exceptions.ClientError(
            {"Error": error, "ResponseMetadata": {"HTTPStatusCode": 400}}, "PutRecords"
        )


@pytest.mark.protocol
@pytest.mark.timeout(120)
def test_a_kms_access_error_is_fatal_and_names_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "arn:aws:kms:us-east-1:123456789012:key/0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6"
    with local_backend() as endpoint:
        kinesis = client("kinesis", endpoint)
        create_stream(kinesis, "encrypted", 1)
        kinesis.start_stream_encryption(StreamName="encrypted", EncryptionType="KMS", KeyId=key)
        props = write_properties(tmp_path / "p.properties", endpoint, "staging", "encrypted", "kms-state")
        for name, value in DUMMY_ENV.items():
            monkeypatch.setenv(name, value)
        from copier.core.config import load_config

        streams = KinesisStreams(load_config(props))
        streams._fast = None
        streams._put = _KmsRefused()
        with pytest.raises(FatalAwsError) as info:
            streams.put_records("encrypted", [("k", b"{}", None)])
    assert info.value.host_wide
    assert key in str(info.value) and "kms:GenerateDataKey" in str(info.value)


# -- order per partition key through faults -------------------------------------------------------------------------


def _copy_through_faults(tmp_path: Path, ordering: str, seed: int) -> str:
    """2,000 events on 20 hot keys through partial failures, throttling and lost answers; copier verify's report."""
    with local_backend() as endpoint:
        kinesis = client("kinesis", endpoint)
        create_stream(kinesis, "staging", 1)
        create_stream(kinesis, "target", 2)
        with FaultProxy(endpoint, seed=seed, hang_s=1.5) as proxy:
            props = write_properties(
                tmp_path / f"{ordering}.properties",
                endpoint,
                "staging",
                "target",
                f"order-{ordering}",
                ordering=ordering,
                targetEndpoint=proxy.endpoint,
                logLevel="INFO",
            )
            env = {**os.environ, **DUMMY_ENV}
            subprocess.run([COPIER, "init", "--properties", str(props)], check=True, capture_output=True, env=env)
            import time

            now = time.monotonic()
            for kind, rate in (("put_partial", 0.6), ("put_throttle", 0.1), ("put_lost_response", 0.1)):
                proxy.add(FaultWindow(kind, now, now + 600, rate))
            proc = Processor(props)
            try:
                proc.initialize("shardId-000000000000")
                for batch in range(4):
                    proc.process_json(records_message(_events(batch * 500, 500, keys=20), 1 + batch * 1000))
                proc.shutdown_requested()
            finally:
                proc.close()
            assert proxy.injected["put_partial"] > 0
            proxy.clear()  # copier verify reads the target through the proxy too, without faults
            manifest = tmp_path / f"{ordering}.manifest"
            manifest.write_text("".join(f"e{n}\n" for n in range(2000)))
            verify = subprocess.run(
                [COPIER, "verify", "--properties", str(props), "--manifest", str(manifest)],
                capture_output=True,
                text=True,
                env=env,
            )
            return verify.stdout + verify.stderr


CLEAN = "lost: 0, pending: 0 (in staging after the copier's committed position), duplicated: 0"


@pytest.mark.protocol
@pytest.mark.timeout(400)
def test_partition_key_order_survives_partial_failures_and_ambiguous_puts(tmp_path: Path) -> None:
    """copier verify: nothing lost or duplicated, and 0 out of order with ordering = partitionKey; the same
    faults with ordering = none put some keys out of order (what the option prevents)."""
    kept = _copy_through_faults(tmp_path, "partitionKey", seed=5)
    assert CLEAN in kept and "out of order (per partition key): 0" in kept, kept
    loose = _copy_through_faults(tmp_path, "none", seed=5)
    assert CLEAN in loose, loose
    assert "out of order (per partition key): 0" not in loose, loose
