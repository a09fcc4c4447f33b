"""The instance profile's credentials on the lean path against botocore's, the reference, on one fake metadata
service: the endpoint and settings read alike, no request storm near expiry, a back-off where botocore asks on
every call, no IMDSv1 where it is disabled, and every malformed answer a copier error."""

from __future__ import annotations

import datetime as dt
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import botocore.exceptions
import botocore.session
import botocore.utils
import pytest

from copier.adapters.awsauth import Credentials, lean_credentials
from copier.adapters.imds import IMDS_TIMEOUT_S, MANDATORY_BEFORE_S, ImdsCredentials, imds_settings
from copier.core.errors import ConfigError, TransientAwsError
from tests.support.fakeaws import clean_aws_env
from tests.support.serving import serving

NOW = dt.datetime(2026, 11, 24, 7, 30, 15, tzinfo=dt.UTC)
BASE = "/latest/meta-data/iam/security-credentials/"


class _Imds(ThreadingHTTPServer):
    """A fake instance metadata service on 127.0.0.1: IMDSv2 (a token is required), one role; what it answers
    can be changed, and every request is counted."""

    daemon_threads = True

    def __init__(self) -> None:
        self.expiration = NOW + dt.timedelta(hours=6)
        self.serial = 0
        self.down = False  # 503 to the token, 401 to the rest
        self.v1: int | None = None  # an IMDSv1-only service: the token PUT answers this status, GETs need none
        self.put_delay = 0.0
        self.hang = threading.Event()  # while set, every request is held unanswered
        self.released = threading.Event()
        self.roles = "copier-host\n"
        self.document: Callable[[int], str] | None = None  # the credentials document, given the serial
        self.requests: list[str] = []
        super().__init__(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server_address[1]}/"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: str) -> None:
                data = body.encode("utf-8", "surrogateescape")  # "\udcff" is the byte 0xff: not UTF-8
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _held(self, what: str) -> bool:
                imds.requests.append(what)
                if imds.hang.is_set():
                    imds.released.wait(30)
                    return True
                return False

            def do_PUT(self) -> None:  # noqa: N802
                if self._held(f"PUT {self.path}"):
                    return
                time.sleep(imds.put_delay)
                if imds.v1 is not None:
                    return self._answer(imds.v1, "")
                ok = self.path == "/latest/api/token" and self.headers["X-aws-ec2-metadata-token-ttl-seconds"]
                self._answer(200 if ok and not imds.down else 503, "tok")

            def do_GET(self) -> None:  # noqa: N802
                if self._held(f"GET {self.path}"):
                    return
                token_ok = imds.v1 is not None or self.headers.get("X-aws-ec2-metadata-token") == "tok"
                if not token_ok or imds.down:
                    return self._answer(401, "")
                if self.path == BASE:
                    return self._answer(200, imds.roles)
                if self.path == BASE + "copier-host":
                    imds.serial += 1
                    if imds.document is not None:
                        return self._answer(200, imds.document(imds.serial))
                    doc = {
                        "Code": "Success",
                        "AccessKeyId": f"ASIA{imds.serial}",
                        "SecretAccessKey": "s",
                        "Token": f"t{imds.serial}",
                        "Expiration": imds.expiration.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    }
                    return self._answer(200, json.dumps(doc))
                return self._answer(404, "")

        return Handler


@pytest.fixture
def imds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[_Imds]:
    """The fake service, and an environment that points botocore at it and sets nothing else."""
    clean_aws_env(monkeypatch, tmp_path)
    with serving(_Imds(), poll_s=0.02) as fake:
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", fake.url)
        try:
            yield fake
        finally:
            fake.released.set()


class _Clock:
    """One fake time for both sides: epoch seconds for the lean path, datetimes for botocore."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = NOW
        monkeypatch.setattr(botocore.utils, "get_current_datetime", lambda: self.now.replace(tzinfo=None))

    def epoch(self) -> float:
        return self.now.timestamp()

    def aware(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def _botocore(clock: _Clock) -> Any:
    """botocore's own instance profile credentials, read now, on ``clock``."""
    credentials = botocore.session.Session().get_credentials()
    assert credentials is not None and credentials.method == "iam-role"
    credentials._time_fetcher = clock.aware  # RefreshableCredentials takes its clock at construction only
    return credentials


def _lean(imds: _Imds, clock: _Clock, **kwargs: Any) -> ImdsCredentials:
    return ImdsCredentials(imds.url, clock=clock.epoch, rng=random.Random(0), **kwargs)


def _signings(source: Any, clock: _Clock, times: int, step_s: float) -> list[Any]:
    """The credentials of ``times`` signings ``step_s`` apart (an exception where one failed)."""
    seen: list[Any] = []
    for _ in range(times):
        try:
            seen.append(source.get_frozen_credentials().access_key)
        except Exception as exc:
            seen.append(exc)
        clock.advance(step_s)
    return seen


@pytest.mark.parametrize("minutes_left", [14, 1, -5], ids=["14-min-left", "1-min-left", "expired"])
def test_credentials_near_or_past_expiry_are_not_fetched_again_at_every_signing(
    imds: _Imds, monkeypatch: pytest.MonkeyPatch, minutes_left: int
) -> None:
    """Handed out with little time left (or expired: the service keeps the last ones while the credential
    service is down), botocore counts them as good for another 2 to 10 minutes plus its refresh window, and asks
    again only then: 3 requests over 20 signings a second apart. The lean path asked 3 a signing, 60 in all."""
    imds.expiration = NOW + dt.timedelta(minutes=minutes_left)
    clock = _Clock(monkeypatch)
    reference = _signings(_botocore(clock), clock, 20, 1.0)
    botocore_requests, imds.requests = len(imds.requests), []
    clock.now = NOW
    lean = _signings(_lean(imds, clock), clock, 20, 1.0)
    assert reference == ["ASIA1"] * 20 and botocore_requests == 3
    assert lean == ["ASIA2"] * 20 and len(imds.requests) == 3


def test_a_failed_refresh_is_remembered_and_an_unresponsive_service_stalls_no_longer_than_botocores(
    imds: _Imds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refresh due, the service unanswering: botocore waits out 2 requests (its 1 s timeout each) and raises on
    every call; the lean path waits the same 2 requests once, keeps the good credentials and backs off."""
    clock = _Clock(monkeypatch)
    reference, lean = _botocore(clock), _lean(imds, clock)
    assert lean.get_frozen_credentials().access_key == "ASIA2"
    assert IMDS_TIMEOUT_S == botocore.session.Session().get_config_variable("metadata_service_timeout")
    clock.now = NOW + dt.timedelta(hours=6, minutes=-14)  # within the refresh window, more than 10 minutes left
    imds.requests = []
    imds.hang.set()
    botocore_seen = _signings(reference, clock, 2, 0.1)
    assert all(isinstance(e, botocore.exceptions.CredentialRetrievalError) for e in botocore_seen)
    assert len(imds.requests) == 4, "botocore: token and role, on every call"
    imds.requests = []
    assert _signings(lean, clock, 3, 0.1) == ["ASIA2"] * 3
    assert len(imds.requests) == 2, "the lean path: token and role once, then a back-off"


def test_a_failed_refresh_keeps_good_credentials_and_never_uses_expiring_ones(
    imds: _Imds, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock(monkeypatch)
    source = _lean(imds, clock)
    first = source.get_frozen_credentials()
    imds.down = True
    clock.now = NOW + dt.timedelta(hours=6, minutes=-14)  # refresh due, 14 minutes left: keep them
    assert source.get_frozen_credentials() is first
    clock.now = NOW + dt.timedelta(hours=6, seconds=-MANDATORY_BEFORE_S + 1)  # under 10 minutes left: refuse
    with pytest.raises(TransientAwsError, match="instance profile credentials"):
        source.get_frozen_credentials()
    requests = len(imds.requests)
    with pytest.raises(TransientAwsError, match="RefreshBackingOff"):
        source.get_frozen_credentials()
    assert len(imds.requests) == requests, "within the back-off: no request"
    imds.down = False
    clock.advance(60)
    assert source.get_frozen_credentials().access_key == "ASIA2"


def test_instance_profile_credentials_come_over_imdsv2_and_are_refreshed_before_they_expire(
    imds: _Imds, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock(monkeypatch)
    source = _lean(imds, clock)
    first = source.get_frozen_credentials()
    assert first == Credentials("ASIA1", "s", "t1")
    assert imds.requests[0] == "PUT /latest/api/token", "IMDSv2: a token first"
    clock.advance(3600)
    assert source.get_frozen_credentials() is first, "hours before the expiry: no new fetch"
    imds.expiration = NOW + dt.timedelta(hours=12)
    clock.now = NOW + dt.timedelta(hours=6, minutes=-14)  # inside the 15-minute refresh window
    assert source.get_frozen_credentials() == Credentials("ASIA2", "s", "t2")


@pytest.mark.parametrize("status", [403, 404, 405, None], ids=["403", "404", "405", "put-timeout"])
def test_an_imds_without_tokens_is_read_over_imdsv1_as_botocore_does(
    imds: _Imds, monkeypatch: pytest.MonkeyPatch, status: int | None
) -> None:
    imds.v1 = status or 200
    imds.put_delay = 0.0 if status else 1.5
    source = _lean(imds, _Clock(monkeypatch))
    assert source.get_frozen_credentials() == Credentials("ASIA1", "s", "t1")
    assert imds.requests[0] == "PUT /latest/api/token", "IMDSv2 tried first"


def test_imdsv1_is_not_used_where_it_is_disabled(imds: _Imds, monkeypatch: pytest.MonkeyPatch) -> None:
    """AWS_EC2_METADATA_V1_DISABLED: the token refused, botocore asks nothing more and has no credentials; nor
    does the lean path (it asked the role and its credentials over IMDSv1)."""
    imds.v1 = 403
    monkeypatch.setenv("AWS_EC2_METADATA_V1_DISABLED", "true")
    with pytest.raises(botocore.exceptions.MetadataRetrievalError):
        botocore.session.Session().get_credentials()
    assert imds.requests == ["PUT /latest/api/token"]
    imds.requests = []
    source = lean_credentials()
    assert isinstance(source, ImdsCredentials)
    with pytest.raises(TransientAwsError, match="IMDSv1 is disabled"):
        source.get_frozen_credentials()
    assert imds.requests == ["PUT /latest/api/token"]


def test_an_imds_token_refused_otherwise_is_an_error(imds: _Imds, monkeypatch: pytest.MonkeyPatch) -> None:
    imds.v1 = 400
    with pytest.raises(TransientAwsError, match="HTTP 400"):
        _lean(imds, _Clock(monkeypatch)).get_frozen_credentials()


MALFORMED: dict[str, tuple[str, Callable[[int], str] | None]] = {
    "empty role list": ("", None),
    "blank role list": ("\n  \n", None),
    "not json": ("copier-host\n", lambda n: "<html>busy</html>"),
    "json not an object": ("copier-host\n", lambda n: "[1, 2]"),
    "an error document": ("copier-host\n", lambda n: '{"Code": "AssumeRoleUnauthorizedAccess", "Message": "no"}'),
    "no token": ("copier-host\n", lambda n: '{"AccessKeyId": "A", "SecretAccessKey": "s", "Expiration": "x"}'),
    "a bad expiration": (
        "copier-host\n",
        lambda n: '{"AccessKeyId": "A", "SecretAccessKey": "s", "Token": "t", "Expiration": "soon"}',
    ),
    "a key with a line break": (
        "copier-host\n",
        lambda n: '{"AccessKeyId": "A\\r\\nX: y", "SecretAccessKey": "s", "Token": "t", "Expiration": "x"}',
    ),
    "not utf-8": ("copier-host\n", lambda n: "\udcff"),
    "deep json": ("copier-host\n", lambda n: "[" * 100_000),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_answer_is_a_copier_error_and_no_credentials(
    imds: _Imds, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """botocore signs with nothing from such an answer (no credentials, or an error); the lean path raises a
    TransientAwsError, never a plain Python exception that would end the process."""
    imds.roles, imds.document = MALFORMED[case]
    try:
        reference = botocore.session.Session().get_credentials()
    except Exception:  # botocore's own failure: it has nothing to sign with either
        reference = None
    assert reference is None
    with pytest.raises(TransientAwsError):
        _lean(imds, _Clock(monkeypatch)).get_frozen_credentials()


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE": "IPv6"},
        {"AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE": "ipv4", "AWS_IMDS_USE_IPV6": "true"},
        {"AWS_IMDS_USE_IPV6": "TRUE"},
        {"AWS_IMDS_USE_IPV6": "yes"},
        {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://localhost:1338/", "AWS_IMDS_USE_IPV6": "true"},
        {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://[fd00:ec2::254]"},
        {"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://imds.internal.example."},
    ],
)
def test_the_endpoint_is_the_one_botocore_chooses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, settings: dict[str, str]
) -> None:
    clean_aws_env(monkeypatch, tmp_path)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    session = botocore.session.Session()
    fetcher = session.get_component("credential_provider").get_provider("iam-role")._role_fetcher
    assert imds_settings(dict(settings)).endpoint == fetcher.get_base_url()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "169.254.169.254"),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://"),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://bad host/"),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://-bad-/"),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://[fd00:ec2::254/"),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://imds\n.example/"),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "ipv5"),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", ""),
    ],
)
def test_an_endpoint_setting_botocore_refuses_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, value: str
) -> None:
    """botocore refuses it whenever it builds its chain, keys in the environment or not (an unbalanced bracket
    with a plain ValueError); so does the lean path, with a ConfigError naming the setting."""
    clean_aws_env(monkeypatch, tmp_path)
    for keys in ({}, {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}):
        environ = {**keys, name: value}
        for key, setting in environ.items():
            monkeypatch.setenv(key, setting)
        with pytest.raises((botocore.exceptions.BotoCoreError, ValueError)):  # botocore: ValueError on "[...'
            botocore.session.Session().get_credentials()
        with pytest.raises(ConfigError, match=name):
            lean_credentials(environ)


def test_a_port_that_is_no_number_is_a_clear_error(imds: _Imds, monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore refuses it at its first request to the service; the lean path as it reads the setting."""
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:port/")
    with pytest.raises(botocore.exceptions.InvalidIMDSEndpointError):
        botocore.session.Session().get_credentials()
    with pytest.raises(ConfigError, match="AWS_EC2_METADATA_SERVICE_ENDPOINT"):
        lean_credentials({"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:port/"})


def test_the_lean_source_follows_the_v1_setting() -> None:
    assert imds_settings({}).v1_allowed
    assert not imds_settings({"AWS_EC2_METADATA_V1_DISABLED": "True"}).v1_allowed
    assert imds_settings({"AWS_EC2_METADATA_V1_DISABLED": "1"}).v1_allowed, "botocore: only 'true' disables"


def test_a_processor_with_a_bad_metadata_endpoint_stops_with_one_line_naming_it(tmp_path: Path) -> None:
    """``copier process`` on the lean path: exit status 2 and the variable named, before any AWS call."""
    import os
    import subprocess

    from tests.support.props import COPIER, write_properties

    props = write_properties(tmp_path / "p.properties", "http://127.0.0.1:9", "staging", "target", "table")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(HOME=str(tmp_path), AWS_ACCESS_KEY_ID="a", AWS_SECRET_ACCESS_KEY="b")
    env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = "169.254.169.254"
    run = subprocess.run(
        [str(COPIER), "process", "--properties", str(props)],
        input="",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert "AWS_EC2_METADATA_SERVICE_ENDPOINT" in run.stderr and run.stdout == ""
