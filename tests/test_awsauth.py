"""The lean path's credentials, signatures and endpoints are botocore's: same signature, same endpoint, and
botocore kept wherever it would do otherwise (the instance profile: tests/test_imds.py)."""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from unittest import mock

import botocore.auth
import botocore.credentials
import botocore.session
import pytest
from botocore.awsrequest import AWSRequest

from copier.adapters import awsauth
from copier.adapters.awsauth import (
    Credentials,
    StaticCredentials,
    endpoint_for,
    lean_credentials,
    lean_reason,
    sign,
)

NOW = dt.datetime(2026, 11, 24, 7, 30, 15, tzinfo=dt.UTC)


@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzEJr//////////token+with/odd=chars"])
@pytest.mark.parametrize(
    ("url", "service", "region"),
    [
        ("https://kinesis.us-east-1.amazonaws.com/", "kinesis", "us-east-1"),
        ("https://dynamodb.cn-north-1.amazonaws.com.cn/", "dynamodb", "cn-north-1"),
        ("http://127.0.0.1:4566/", "kinesis", "eu-west-1"),
        ("http://[::1]:4566/", "kinesis", "eu-west-1"),
        ("https://[fd00:ec2::1]/", "dynamodb", "eu-west-1"),
        ("https://vpce-0a1b.kinesis.eu-central-1.vpce.amazonaws.com:8443/", "kinesis", "eu-central-1"),
    ],
)
def test_a_signature_is_the_one_botocore_makes(token: str | None, url: str, service: str, region: str) -> None:
    rng = random.Random(f"{url}{token}")
    body = json.dumps({"StreamName": "s", "Records": [{"Data": "eA==", "PartitionKey": str(rng.random())}]}).encode()
    headers = {"X-Amz-Target": "Kinesis_20131202.PutRecords", "Content-Type": "application/x-amz-json-1.1"}
    ours = sign(
        Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token),
        service,
        region,
        url,
        headers,
        body,
        now=NOW,
    )
    request = AWSRequest(method="POST", url=url, data=body, headers=dict(headers))
    theirs = botocore.credentials.Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    with mock.patch.object(botocore.auth, "get_current_datetime", return_value=NOW.replace(tzinfo=None)):
        botocore.auth.SigV4Auth(theirs.get_frozen_credentials(), service, region).add_auth(request)
    assert ours["Authorization"] == request.headers["Authorization"]
    assert ours["X-Amz-Date"] == request.headers["X-Amz-Date"]
    assert ours.get("X-Amz-Security-Token") == request.headers.get("X-Amz-Security-Token")


def _botocore_signature(credentials: Credentials, service: str, region: str, body: bytes, now: dt.datetime) -> str:
    request = AWSRequest(method="POST", url="https://kinesis.us-east-1.amazonaws.com/", data=body, headers={})
    theirs = botocore.credentials.Credentials(credentials.access_key, credentials.secret_key, credentials.token)
    with mock.patch.object(botocore.auth, "get_current_datetime", return_value=now.replace(tzinfo=None)):
        botocore.auth.SigV4Auth(theirs.get_frozen_credentials(), service, region).add_auth(request)
    return str(request.headers["Authorization"])


def test_the_cached_signing_key_follows_the_day_the_region_the_service_and_a_rotated_secret() -> None:
    """The derived key is cached (``awsauth._signing_key``); signed one after the other, with each of the day
    (a signature either side of midnight), the region, the service and the secret (credentials rotated under
    the same access key, as an instance profile's are) changed in turn, every signature is botocore's."""
    first = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "token-1")
    rotated = Credentials("AKIDEXAMPLE", "rotatedSecretKeyOfTheSameAccessKey/EXAMPLE", "token-2")
    midnight = dt.datetime(2026, 11, 24, 23, 59, 59, tzinfo=dt.UTC)
    steps = [
        (first, "kinesis", "us-east-1", midnight),
        (first, "kinesis", "us-east-1", midnight + dt.timedelta(seconds=1)),
        (first, "kinesis", "eu-west-1", midnight + dt.timedelta(seconds=1)),
        (first, "dynamodb", "eu-west-1", midnight + dt.timedelta(seconds=1)),
        (rotated, "dynamodb", "eu-west-1", midnight + dt.timedelta(seconds=1)),
        (rotated, "kinesis", "us-east-1", midnight),
        (first, "kinesis", "us-east-1", midnight),
    ]
    for credentials, service, region, now in steps:
        ours = sign(credentials, service, region, "https://kinesis.us-east-1.amazonaws.com/", {}, b"{}", now=now)
        assert ours["Authorization"] == _botocore_signature(credentials, service, region, b"{}", now), (
            credentials.secret_key[:8],
            service,
            region,
            now,
        )


@pytest.mark.parametrize(
    "region",
    [
        "us-east-1",
        "eu-west-1",
        "ap-southeast-5",
        "cn-north-1",
        "cn-northwest-1",
        "us-gov-west-1",
        "us-iso-east-1",
        "us-isob-east-1",
        "eu-isoe-west-1",
        "mx-central-1",
        "il-central-1",
        "eusc-de-east-1",
    ],
)
@pytest.mark.parametrize("service", ["kinesis", "dynamodb"])
def test_the_endpoint_is_the_one_botocore_resolves(service: str, region: str) -> None:
    session = botocore.session.get_session()
    client = session.create_client(
        service, region_name=region, aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret"
    )
    assert endpoint_for(service, region) == client.meta.endpoint_url


def test_a_region_in_no_partition_has_no_endpoint_and_keeps_botocore() -> None:
    assert endpoint_for("kinesis", "mars-north-1") is None
    env = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "HOME": "/nonexistent"}
    assert (
        lean_reason([("kinesis", "mars-north-1", None)], None, env)
        == "region 'mars-north-1' is in no partition this copier knows"
    )


def test_botocore_is_kept_wherever_it_would_do_otherwise(tmp_path: Path) -> None:
    """Each setting botocore reads before (or instead of) what the lean path does keeps botocore."""
    keys = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "HOME": str(tmp_path)}
    here = [("kinesis", "us-east-1", None), ("dynamodb", "us-east-1", None)]
    assert lean_reason(here, None, keys) is None, "keys in the environment: lean"
    assert lean_reason(here, None, {"HOME": str(tmp_path)}) is None, "no keys, no files: the instance profile"
    assert lean_reason([("kinesis", "us-east-1", "http://127.0.0.1:4566")], None, keys) is None, (
        "an endpoint of copier's own"
    )
    assert "copier.targetRoleArn" in str(lean_reason(here, "arn:aws:iam::1:role/r", keys))
    for name in (
        "AWS_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_KINESIS",
        "AWS_USE_FIPS_ENDPOINT",
        "AWS_CREDENTIAL_FILE",
        "AWS_CREDENTIAL_EXPIRATION",
        "AWS_ACCOUNT_ID",
        "AWS_ACCOUNT_ID_ENDPOINT_MODE",
        "AWS_METADATA_SERVICE_TIMEOUT",
        "AWS_METADATA_SERVICE_NUM_ATTEMPTS",
    ):
        assert lean_reason(here, None, {**keys, name: "x"}) == f"{name} is set"
    https = {**keys, "AWS_EC2_METADATA_SERVICE_ENDPOINT": "https://imds.example/"}
    assert "https" in str(lean_reason(here, None, https)), "the lean path reads the instance profile over http"
    for name in ("AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE"):
        assert "blank" in str(lean_reason(here, None, {**keys, name: " "})), "botocore refuses a blank bundle"
    assert "only one of" in str(lean_reason(here, None, {"AWS_ACCESS_KEY_ID": "a", "HOME": str(tmp_path)}))
    disabled = {"AWS_EC2_METADATA_DISABLED": "true", "HOME": str(tmp_path)}
    assert "AWS_EC2_METADATA_DISABLED" in str(lean_reason(here, None, disabled))
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "config").write_text("[default]\nuse_fips_endpoint = true\n")
    assert lean_reason(here, None, keys) == f"{tmp_path / '.aws' / 'config'} exists"
    assert lean_reason(here, None, {**keys, "AWS_CONFIG_FILE": "/nonexistent"}) is None
    assert lean_reason(here, None, keys | {"AWS_CONFIG_FILE": "/nonexistent"}, proxied=lambda url: True) == (
        "an HTTP proxy is configured for https://kinesis.us-east-1.amazonaws.com"
    )


def test_config_files_are_found_where_botocore_looks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``~`` and ``$VAR`` expanded in the file settings, the password database's home without HOME, and a
    path that cannot be checked (too long, a directory) read as absent instead of raising."""
    here = [("kinesis", "us-east-1", None)]
    keys = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}
    (tmp_path / "creds").write_text("[default]\n")
    expected = f"{tmp_path / 'creds'} exists"
    tilde = {**keys, "HOME": str(tmp_path), "AWS_SHARED_CREDENTIALS_FILE": "~/creds"}
    assert lean_reason(here, None, tilde) == expected
    env = {**keys, "HOME": "/nonexistent", "DIR": str(tmp_path), "AWS_CONFIG_FILE": "${DIR}/creds"}
    assert lean_reason(here, None, env) == expected
    assert lean_reason(here, None, {**env, "AWS_CONFIG_FILE": "$DIR/creds"}) == expected
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "config").write_text("[default]\n")
    monkeypatch.setattr(awsauth.pwd, "getpwuid", lambda uid: mock.Mock(pw_dir=str(tmp_path)))
    assert lean_reason(here, None, keys) == f"{tmp_path / '.aws' / 'config'} exists", "HOME unset: passwd's home"
    (tmp_path / ".aws" / "config").unlink()
    (tmp_path / ".aws" / "config").mkdir()
    assert lean_reason(here, None, keys) is None, "a directory is no config file"
    assert lean_reason(here, None, {**keys, "HOME": "/nonexistent", "AWS_CONFIG_FILE": "/" + "a" * 5000}) is None


def test_environment_keys_are_used_as_they_are() -> None:
    source = lean_credentials({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "AWS_SESSION_TOKEN": "t"})
    assert isinstance(source, StaticCredentials)
    assert source.get_frozen_credentials() == Credentials("a", "b", "t")
    keys = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}
    both = lean_credentials({**keys, "AWS_SECURITY_TOKEN": "old", "AWS_SESSION_TOKEN": "t"})
    assert both.get_frozen_credentials() == Credentials("a", "b", "old"), "botocore reads AWS_SECURITY_TOKEN first"
    assert lean_credentials({**keys, "AWS_SECURITY_TOKEN": "old"}).get_frozen_credentials().token == "old"


PATHS = [
    "~",
    "~/",
    "~/.aws/config",
    "~nosuchuser-copier/x",
    "~root/x",
    "$HOME/x",
    "${HOME}/x",
    "$UNSET_COPIER/x",
    "${UNSET_COPIER}/x",
    "$",
    "${}",
    "a$HOME",
    "$DIR/config",
    "${DIR}config",
    "$DIRü/x",
    "x/~/y",
    "/etc/boto.cfg",
]


@pytest.mark.parametrize("home", ["/home/copier", "/home/copier/", "", None], ids=["home", "slash", "empty", "unset"])
def test_file_settings_expand_as_botocore_expands_them(monkeypatch: pytest.MonkeyPatch, home: str | None) -> None:
    """Variables first, then ``~`` (botocore: ``os.path.expanduser(os.path.expandvars(path))``), HOME set but
    empty taken as it is, ``~name`` a user's home: the lean path looks at the very files botocore reads."""
    monkeypatch.setenv("DIR", "~/cfg")
    monkeypatch.delenv("UNSET_COPIER", raising=False)
    if home is None:
        monkeypatch.delenv("HOME", raising=False)
    else:
        monkeypatch.setenv("HOME", home)
    import os

    for path in PATHS:
        expected = os.path.expanduser(os.path.expandvars(path))
        assert awsauth._expanduser(awsauth._expandvars(path, os.environ), os.environ) == expected, path


def _credential_process(directory: Path) -> Path:
    """A config file whose default profile takes its credentials from a process (another identity)."""
    script = directory / "creds.sh"
    script.write_text('#!/bin/sh\necho \'{"Version": 1, "AccessKeyId": "PROCESS", "SecretAccessKey": "s"}\'\n')
    script.chmod(0o755)
    config = directory / "config"
    config.write_text(f"[default]\ncredential_process = {script}\n")
    return config


@pytest.mark.parametrize("naming", ["variable holding ~", "braced variable holding ~", "~user"])
def test_a_credential_process_botocore_would_use_keeps_botocore(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, naming: str
) -> None:
    """botocore signs as the config file's credential_process says; the lean path would have signed as the
    instance profile (it did not find the file: it expanded ``~`` before the variable that holds it). Wherever
    botocore reads another identity, the lean path is not taken."""
    import os
    import pwd

    from tests.support.fakeaws import clean_aws_env

    clean_aws_env(monkeypatch, tmp_path)
    (tmp_path / "cfg").mkdir()
    _credential_process(tmp_path / "cfg")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "false")
    real = pwd.getpwnam
    monkeypatch.setattr(
        pwd, "getpwnam", lambda name: mock.Mock(pw_dir=str(tmp_path)) if name == "copier-user" else real(name)
    )
    setting = {
        "variable holding ~": ("$CFG/config", "~/cfg"),
        "braced variable holding ~": ("${CFG}/config", "~/cfg"),
        "~user": ("~copier-user/cfg/config", ""),
    }[naming]
    monkeypatch.setenv("AWS_CONFIG_FILE", setting[0])
    monkeypatch.setenv("CFG", setting[1])
    reference = botocore.session.Session().get_credentials()
    assert reference is not None and reference.access_key == "PROCESS"
    reason = lean_reason([("kinesis", "us-east-1", None)], None, dict(os.environ))
    assert reason == f"{tmp_path / 'cfg' / 'config'} exists"


def test_signatures_at_the_current_time_are_botocore_s_second_by_second_headers_and_token_changed() -> None:
    """Without a given time, a signature is botocore's for the second it is made in (the X-Amz-Date text is
    kept from one second to the next, never past it), and the canonical headers kept per header set follow a
    change of target, of Host and of security token (credentials refreshed), each signature botocore's."""
    first = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "token-1")
    rotated = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "token-2")
    unsigned = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None)
    put = {"X-Amz-Target": "Kinesis_20131202.PutRecords", "Content-Type": "application/x-amz-json-1.1"}
    item = {"X-Amz-Target": "DynamoDB_20120810.PutItem", "Content-Type": "application/x-amz-json-1.0"}
    second = NOW.timestamp()
    steps = [
        (first, put, "https://kinesis.us-east-1.amazonaws.com/", second + 0.2),
        (first, put, "https://kinesis.us-east-1.amazonaws.com/", second + 0.9),
        (first, put, "https://kinesis.us-east-1.amazonaws.com/", second + 1.0),
        (first, item, "https://kinesis.us-east-1.amazonaws.com/", second + 1.5),
        (rotated, item, "https://kinesis.us-east-1.amazonaws.com/", second + 1.5),
        (unsigned, item, "https://kinesis.us-east-1.amazonaws.com/", second + 2.5),
        (first, put, "http://127.0.0.1:4566/", second + 86400.5),
    ]
    for credentials, headers, url, at in steps:
        body = json.dumps({"at": at}).encode()
        with mock.patch.object(awsauth.time, "time", return_value=at):
            ours = sign(credentials, "kinesis", "us-east-1", url, headers, body)
        moment = dt.datetime.fromtimestamp(int(at), dt.UTC)
        request = AWSRequest(method="POST", url=url, data=body, headers=dict(headers))
        theirs = botocore.credentials.Credentials(credentials.access_key, credentials.secret_key, credentials.token)
        with mock.patch.object(botocore.auth, "get_current_datetime", return_value=moment.replace(tzinfo=None)):
            botocore.auth.SigV4Auth(theirs.get_frozen_credentials(), "kinesis", "us-east-1").add_auth(request)
        assert ours["X-Amz-Date"] == request.headers["X-Amz-Date"], (at, url)
        assert ours["Authorization"] == request.headers["Authorization"], (at, url, credentials.token)
        assert ours.get("X-Amz-Security-Token") == request.headers.get("X-Amz-Security-Token")
