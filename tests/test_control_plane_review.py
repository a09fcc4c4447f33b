"""The adversarial review of the control-plane budget change (issue 47: the host's shared DescribeStreamSummary
answer, the record limit planned under 10 MiB when unread, check-config through a throttle): each test here
failed on the change as first written, and names what it found.

The processors are ``KinesisStreams`` of the lean path against the fake AWS endpoint of
``tests/support/fakeaws.py`` (the local backend cannot hold a lock for another processor mid-call, nor
throttle); the daemon runs are real processes (``copier run``'s supervisor, a Python program standing for the
KCL daemon, ``copier process``'s share as a child); the stalled shard is the in-memory world of
``tests/support/fakes.py``, as in ``tests/test_put_answers.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import botocore.exceptions
import pytest

from copier.adapters import summaries, summaryshare
from copier.adapters.awsauth import Credentials, StaticCredentials
from copier.adapters.kinesis import KinesisStreams
from copier.adapters.summaryshare import SHARE_ENV, SummaryShare
from copier.core.config import Config, load_config
from copier.core.limits import MAX_RECORD_BYTES
from copier.core.streamsettings import StreamSettings, blocking
from copier.core.summaryage import Answer
from tests.support.fakeaws import FakeAws, clean_aws_env, fake_aws, json_reply
from tests.support.fakes import World, config
from tests.support.props import write_properties
from tests.test_adversarial import ids_in
from tests.test_put_answers import at, give_up_after

KEYS = Credentials("AKIDEXAMPLE", "secret")
ROLE = "arn:aws:iam::111111111111:role/copier-target"
KEYED = {"StreamDescriptionSummary": {"RetentionPeriodHours": 24, "RecordDistributionStrategy": "USER_PARTITION_KEY"}}
AUTO = {"StreamDescriptionSummary": {"RetentionPeriodHours": 24, "RecordDistributionStrategy": "AUTO"}}

# ``copier process`` as far as the share goes: the share of its daemon (its parent), an answer written ("write":
# the target's limit 1 MiB, received now) or read ("read": printed, "None" for none).
PROCESSOR = """
import sys, time
from copier.adapters.summaryshare import SHARE_ENV, SummaryShare
from copier.core.config import load_config
from copier.core.streamsettings import StreamSettings
from copier.core.summaryage import Answer
share = SummaryShare.for_host(load_config(sys.argv[1]))  # None: this processor asks alone, shares nothing
if sys.argv[2] == "write":
    answer = Answer().answered(StreamSettings("target", max_record_bytes=1 << 20), time.monotonic(), 0.0)
    if share is not None:
        share.write("target", answer)
else:
    answer = share.read("target") if share is not None else None
    print(None if answer is None else answer.settings)
"""
# The KCL daemon, as far as its children see it: run by copier run's real supervisor (copier.kcl.supervisor), it
# starts one processor per action, one after the other, and ends.
DAEMON = (
    "import subprocess, sys\n"
    "for action in sys.argv[3:]:\n"
    "    subprocess.check_call([sys.executable, '-c', sys.argv[1], sys.argv[2], action])\n"
)


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_aws_env(monkeypatch, tmp_path)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # the share's base, this test's alone (children)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # (this process: gettempdir() caches)


@pytest.fixture
def fake() -> Iterator[FakeAws]:
    with fake_aws() as served:
        yield served


def _properties(tmp_path: Path, url: str = "http://127.0.0.1:9") -> Path:
    return write_properties(tmp_path / "p.properties", url, "staging", "target", "table")


def _daemon_run(tmp_path: Path, actions: list[str], prefix: list[str]) -> str:
    """One ``copier run`` (its supervisor, ``prefix``: what starts it, e.g. in a new PID namespace) whose daemon
    starts a processor for each of ``actions`` in turn; their output."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    daemon = [sys.executable, "-c", DAEMON, PROCESSOR, str(_properties(tmp_path)), *actions]
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "copier.kcl.supervisor", *daemon],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "stopped on its own" in done.stderr, done.stderr  # the daemon's end
    return done.stdout.strip()


def test_a_processor_with_no_answer_does_not_forward_to_a_target_it_has_not_read(
    fake: FakeAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's first processor to start asks for the target (holding its turn) and is stuck there; a second
    starting meanwhile has no answer of its own. It must not forward under ``ordering = partitionKey`` to a
    target it has never read: after a bounded wait it asks for itself, finds the target AUTO, and stops."""
    monkeypatch.setattr(summaries, "FIRST_ANSWER_WAIT_S", 0.2)
    fake.replies = [json_reply(200, KEYED), json_reply(200, AUTO)]
    config = load_config(_properties(tmp_path, fake.url))
    share = SummaryShare(tmp_path / "share")  # the host's share, wherever it is kept
    share.directory.mkdir(mode=0o700)
    second = KinesisStreams(config, lean=StaticCredentials(KEYS), share=share)
    with share.turn("target") as first_asking:  # the first processor, mid-call
        assert first_asking
        staging = second.settings("staging")
        target = second.settings("target")
    assert blocking(staging, target, "partitionKey") is not None


def test_a_processor_with_no_answer_takes_the_askers_answer_when_it_comes(fake: FakeAws, tmp_path: Path) -> None:
    """The same start, the first processor's call answered while the second waits: the second acts on that
    answer (AUTO: it stops) and makes no call of its own for the target."""
    fake.replies = [json_reply(200, KEYED)]  # the staging call only: a second target call would find no reply
    config = load_config(_properties(tmp_path, fake.url))
    share = SummaryShare(tmp_path / "share")
    share.directory.mkdir(mode=0o700)
    second = KinesisStreams(config, lean=StaticCredentials(KEYS), share=share)
    asking, answered = threading.Event(), threading.Event()

    def first() -> None:
        with share.turn("target") as mine:
            assert mine
            asking.set()
            answered.wait(30)  # the call takes as long as the second's wait has begun
            now = time.monotonic()
            share.write("target", Answer().answered(StreamSettings("target", distribution="AUTO"), now, 0.0))

    holder = threading.Thread(target=first)
    holder.start()
    assert asking.wait(30)
    staging = second.settings("staging")
    threading.Timer(0.1, answered.set).start()
    target = second.settings("target")
    holder.join(30)
    assert target is not None and target.distribution == "AUTO"
    assert blocking(staging, target, "partitionKey") is not None
    assert len(fake.received) == 1, "the target's answer came from the first processor's call"


def test_the_processors_of_one_daemon_run_share_one_answer(tmp_path: Path) -> None:
    """The share exists for this: one processor's answer is the next one's, within a run."""
    assert _daemon_run(tmp_path, ["write", "read"], []).startswith("StreamSettings(name='target'")


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare (a PID namespace)")
def test_a_daemon_run_with_a_previous_runs_pid_starts_with_no_answer(tmp_path: Path) -> None:
    """Two daemon runs one after the other, each in a PID namespace of its own (a container restarted): both
    daemons are PID 1 there. The second run's processor must not read the answer the first run's wrote."""
    namespace = ["unshare", "--pid", "--fork", "--mount-proc"]
    probe = subprocess.run([*namespace, "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"no PID namespace here: {probe.stderr.decode(errors='replace').strip()}")
    assert _daemon_run(tmp_path, ["write"], namespace) == ""
    assert _daemon_run(tmp_path, ["read"], namespace) == "None"


def test_a_daemon_runs_share_is_not_left_behind_once_it_ended(tmp_path: Path) -> None:
    """A daemon run ends (its processor wrote an answer): nothing of its share is left; a run killed before it
    could clean up (its supervisor SIGKILLed) is removed by the next run."""
    assert _daemon_run(tmp_path, ["write"], []) == ""
    tmp = Path(tempfile.gettempdir())
    assert list(tmp.iterdir()) == [], "not even the user's directory is left"
    killed = subprocess.Popen([sys.executable, "-m", "copier.kcl.supervisor", "sleep", "600"])
    base = tmp / f"copier-{os.getuid()}"
    deadline = time.monotonic() + 60
    while not list(base.glob("summaries-*/owner")):
        assert time.monotonic() < deadline and killed.poll() is None
        time.sleep(0.05)
    killed.kill()
    killed.wait()
    (left,) = base.glob("summaries-*")
    assert _daemon_run(tmp_path, ["read"], []) == "None"
    assert not left.exists() and list(tmp.iterdir()) == []


def test_a_run_directory_whose_maker_died_before_naming_itself_is_removed_once_it_is_old(tmp_path: Path) -> None:
    """A supervisor SIGKILLed between making its run's directory and writing its pid there leaves a directory
    with no owner. One being made now is left alone; one older than ``UNOWNED_GRACE_S`` is removed (before,
    it was kept for ever). The owner is written whole or not at all: never an empty file to misread."""
    making, abandoned = tmp_path / "summaries-making", tmp_path / "summaries-abandoned"
    making.mkdir()
    abandoned.mkdir()
    (abandoned / ".owner").write_text("", encoding="ascii")  # killed mid-write: the owner was never named
    old = time.time() - summaryshare.UNOWNED_GRACE_S - 1
    os.utime(abandoned, (old, old))
    assert summaryshare.prune(tmp_path) == [abandoned]
    assert making.exists() and not abandoned.exists()


class _ThrottledTarget:
    """The target as the role sees it, at a fleet's start: DescribeStreamSummary over the account's 20 calls a
    second (the local backend cannot throttle)."""

    def create_client(self, *args: object, **kwargs: object) -> _ThrottledTarget:
        return self

    def describe_stream_summary(self, **kwargs: object) -> dict[str, object]:
        error = {"Code": "LimitExceededException", "Message": "Rate exceeded for stream target under account 1111."}
        raise botocore.exceptions.ClientError(
            {"Error": error, "ResponseMetadata": {"HTTPStatusCode": 400}}, "DescribeStreamSummary"
        )


def _check_config(config: Config) -> None:
    from copier.commands.preflight import check_config

    assert check_config(config, offline=False) == 0


def _check_before_run(config: Config) -> None:
    from copier.commands.preflight import check_before_run

    check_before_run(config)  # raises when the start would not go on


@pytest.mark.parametrize("check", [_check_config, _check_before_run], ids=["check-config", "run"])
def test_a_throttled_describe_of_a_target_behind_a_role_lets_the_start_go_on(
    fake: FakeAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, check: Callable[[Config], None]
) -> None:
    """The same throttle that check-config and ``copier run`` let through for a target the host's credentials
    reach (tests/test_control_plane_budget.py) lets the start go on for a target in another account too."""
    monkeypatch.setattr("copier.adapters.target.target_session", lambda config: _ThrottledTarget())
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEYS.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", KEYS.secret_key)
    table = {"Table": {"TableName": "table", "TableStatus": "ACTIVE"}}
    ttl = {"TimeToLiveDescription": {"TimeToLiveStatus": "ENABLED", "AttributeName": "expires_at"}}
    throttled = {"__type": "LimitExceededException", "message": "Rate exceeded for stream staging"}
    fake.replies = [json_reply(200, table), json_reply(200, ttl)] + [json_reply(400, throttled) for _ in range(10)]
    props = write_properties(tmp_path / "p.properties", fake.url, "staging", "target", "table", targetRoleArn=ROLE)
    check(load_config(props))


def test_a_record_the_target_refuses_does_not_stall_the_shard_while_its_limit_stays_unreadable() -> None:
    """The target's limit is 1 MiB and DescribeStreamSummary for it fails for the whole test: the 1.5 MiB record
    is tried and refused; the shard must not wait on the control-plane call: the chunk's other record reaches
    the target once and the refused one goes to the dead-letter stream once."""
    world = World(cfg=config(deadLetterStreamName="dlq"))
    world.streams.max_record_bytes["dlq"] = 10 * MAX_RECORD_BYTES  # the envelope keeps the payload
    world.streams.unreadable.add("target")
    give_up_after(world)
    world.worker().process([at(world, 1, "a"), at(world, 2, "big", size=MAX_RECORD_BYTES * 3 // 2)])
    assert world.target_ids() == Counter({"a": 1}) and ids_in(world.streams) == Counter({"a": 1, "big": 1})


def test_an_answer_missing_a_field_or_with_one_of_another_type_is_not_trusted() -> None:
    """The target's limit raised to 4 MiB, as another copier version might write it: without the field, or as a
    string. Neither is acted on."""
    good = Answer().answered(StreamSettings("target", 86_400_000, 4 * MAX_RECORD_BYTES), 100.0, 0.0)
    raw = json.loads(good.encode())
    assert Answer.decode(json.dumps(raw)) == good
    settings = raw["settings"]
    missing = {**raw, "settings": {k: v for k, v in settings.items() if k != "max_record_bytes"}}
    retyped = {**raw, "settings": {**settings, "max_record_bytes": str(4 * MAX_RECORD_BYTES)}}
    assert Answer.decode(json.dumps(missing)) is None
    assert Answer.decode(json.dumps(retyped)) is None


def test_a_host_without_a_usable_temporary_directory_forwards_without_the_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No temporary directory can be had (CPython's own error, stubbed: this machine's tests run as root, for
    whom every directory is writable): no share, no error."""

    def none_usable() -> str:
        raise FileNotFoundError(2, "No usable temporary directory found in ['/tmp', '/var/tmp', '/usr/tmp', '/']")

    monkeypatch.setattr(tempfile, "gettempdir", none_usable)
    assert SummaryShare.start_run() is None
    assert SummaryShare.for_host(load_config(_properties(tmp_path)), {}) is None


def test_targets_of_one_name_in_two_accounts_do_not_share_an_answer(tmp_path: Path) -> None:
    """Two configurations of one daemon run (its file edited between two processors' starts) whose targets are
    named alike but reached through roles in two accounts: no answer of one is the other's. The same account
    again shares."""
    run = SummaryShare.start_run()
    assert run is not None
    env = {SHARE_ENV: str(run)}
    try:
        shares = []
        for account in ("111111111111", "222222222222", "111111111111"):
            path = tmp_path / f"{account}.properties"
            role = f"arn:aws:iam::{account}:role/copier-target"
            props = write_properties(path, "http://127.0.0.1:9", "staging", "target", "table", targetRoleArn=role)
            shares.append(SummaryShare.for_host(load_config(props), env))
        first, second, again = shares
        assert first is not None and second is not None and again is not None
        assert first.directory != second.directory and again.directory == first.directory
    finally:
        SummaryShare.end_run(run)
    assert not run.exists()
