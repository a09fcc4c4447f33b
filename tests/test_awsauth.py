"""The lean path's credentials, signatures and endpoints are botocore's: same signature, same endpoint,
the instance profile over IMDSv2 with its refresh, and botocore kept wherever it would do otherwise."""

from __future__ import annotations

import datetime as dt
import json
import random
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import botocore.auth
import botocore.credentials
import botocore.session
import pytest
from botocore.awsrequest import AWSRequest

from copier.adapters import awsauth
from copier.adapters.awsauth import (
    MANDATORY_BEFORE_S,
    Credentials,
    ImdsCredentials,
    StaticCredentials,
    endpoint_for,
    lean_credentials,
    lean_reason,
    sign,
)
from copier.core.errors import TransientAwsError

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
    ):
        assert lean_reason(here, None, {**keys, name: "x"}) == f"{name} is set"
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


def test_the_instance_profile_endpoint_is_botocores() -> None:
    default = lean_credentials({})
    ipv6 = lean_credentials({"AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE": "IPv6"})
    assert isinstance(default, ImdsCredentials) and isinstance(ipv6, ImdsCredentials)
    assert (default._host, default._port) == ("169.254.169.254", 80)
    assert (ipv6._host, ipv6._port) == ("fd00:ec2::254", 80)


class _Imds:
    """A fake instance metadata service on 127.0.0.1: IMDSv2 only (a token is required), one role."""

    def __init__(self) -> None:
        self.expiration = NOW + dt.timedelta(hours=6)
        self.serial = 0
        self.down = False
        self.v1: int | None = None  # an IMDSv1-only service: the token PUT answers this status, GETs need none
        self.put_delay = 0.0
        self.requests: list[str] = []
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: str) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def do_PUT(self) -> None:  # noqa: N802
                imds.requests.append(f"PUT {self.path}")
                time.sleep(imds.put_delay)
                if imds.v1 is not None:
                    return self._answer(imds.v1, "")
                ok = self.path == "/latest/api/token" and self.headers["X-aws-ec2-metadata-token-ttl-seconds"]
                self._answer(200 if ok and not imds.down else 503, "tok")

            def do_GET(self) -> None:  # noqa: N802
                imds.requests.append(f"GET {self.path}")
                token_ok = imds.v1 is not None or self.headers.get("X-aws-ec2-metadata-token") == "tok"
                if not token_ok or imds.down:
                    return self._answer(401, "")
                base = "/latest/meta-data/iam/security-credentials/"
                if self.path == base:
                    return self._answer(200, "copier-host\n")
                if self.path == base + "copier-host":
                    imds.serial += 1
                    doc = {
                        "AccessKeyId": f"ASIA{imds.serial}",
                        "SecretAccessKey": "s",
                        "Token": f"t{imds.serial}",
                        "Expiration": imds.expiration.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    }
                    return self._answer(200, json.dumps(doc))
                return self._answer(404, "")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def imds() -> Iterator[_Imds]:
    fake = _Imds()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def test_instance_profile_credentials_come_over_imdsv2_and_are_refreshed_before_they_expire(imds: _Imds) -> None:
    now = [NOW.timestamp()]
    source = lean_credentials({"AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url})
    assert isinstance(source, ImdsCredentials)
    source = ImdsCredentials(imds.url, clock=lambda: now[0])
    first = source.get_frozen_credentials()
    assert first == Credentials("ASIA1", "s", "t1")
    assert imds.requests[0] == "PUT /latest/api/token", "IMDSv2: a token first"
    now[0] += 3600
    assert source.get_frozen_credentials() is first, "hours before the expiry: no new fetch"
    imds.expiration = NOW + dt.timedelta(hours=12)
    now[0] = NOW.timestamp() + 6 * 3600 - 14 * 60  # inside the 15-minute refresh window
    assert source.get_frozen_credentials() == Credentials("ASIA2", "s", "t2")


def test_a_failed_refresh_keeps_good_credentials_and_never_uses_expiring_ones(imds: _Imds) -> None:
    now = [NOW.timestamp()]
    source = ImdsCredentials(imds.url, clock=lambda: now[0])
    first = source.get_frozen_credentials()
    imds.down = True
    now[0] = NOW.timestamp() + 6 * 3600 - 14 * 60  # refresh due, 14 minutes left: keep them
    assert source.get_frozen_credentials() is first
    now[0] = NOW.timestamp() + 6 * 3600 - MANDATORY_BEFORE_S + 1  # under 10 minutes left: refuse
    with pytest.raises(TransientAwsError, match="instance profile credentials"):
        source.get_frozen_credentials()
    imds.down = False
    assert source.get_frozen_credentials().access_key == "ASIA2"


@pytest.mark.parametrize("status", [403, 404, 405, None], ids=["403", "404", "405", "put-timeout"])
def test_an_imds_without_tokens_is_read_over_imdsv1_as_botocore_does(imds: _Imds, status: int | None) -> None:
    imds.v1 = status or 200
    imds.put_delay = 0.0 if status else 1.0
    source = ImdsCredentials(imds.url, clock=lambda: NOW.timestamp(), timeout=0.3)
    assert source.get_frozen_credentials() == Credentials("ASIA1", "s", "t1")
    assert imds.requests[0] == "PUT /latest/api/token", "IMDSv2 tried first"


def test_an_imds_token_refused_otherwise_is_an_error(imds: _Imds) -> None:
    imds.v1 = 400
    source = ImdsCredentials(imds.url, clock=lambda: NOW.timestamp())
    with pytest.raises(TransientAwsError, match="HTTP 400"):
        source.get_frozen_credentials()
