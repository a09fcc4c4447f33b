"""``copier check-config`` and ``copier run`` catch what breaks a deployment before the JVM starts.

Each mistake a user made (issue 23): a key given twice, a misspelt KCL or
copier key, an ``executableName`` that does not exist or that runs processors
with another properties file, a state table that does not exist; and the
command line around it (``--properties`` or a positional file, ``--version``,
dummy credentials against the local backend).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from copier.core.config import COPIER_KEYS
from copier.core.propertylint import close_key, lint_properties
from tests.conftest import Pipeline
from tests.support.backend import DUMMY_ENV, ROOT

COPIER = str(ROOT / ".venv" / "bin" / "copier")
LOCAL = ROOT / "properties" / "local.properties"


def copier(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **DUMMY_ENV} if env is None else env
    return subprocess.run([COPIER, *args], capture_output=True, text=True, env=environment, timeout=120)


def variant(tmp_path: Path, *extra: str, executable: str | None = None) -> Path:
    """properties/local.properties with lines added, and its executableName pointing at itself (or ``executable``)."""
    path = tmp_path / "copier.properties"
    lines = LOCAL.read_text().splitlines()
    command = executable or f"{COPIER} process --properties {path}"
    lines = [f"executableName = {command}" if line.startswith("executableName") else line for line in lines]
    path.write_text("\n".join([*lines, *extra]) + "\n")
    return path


def test_a_key_given_twice_is_an_error_naming_both_lines(tmp_path: Path) -> None:
    path = variant(tmp_path, "maxRecords = 100", "maxRecords = 200")
    result = copier("check-config", "--offline", str(path))
    assert result.returncode == 2, result
    assert "maxRecords: given twice (lines" in result.stderr and "the later wins" in result.stderr


def test_a_misspelt_kcl_key_is_an_error_with_a_guess(tmp_path: Path) -> None:
    """The daemon would ignore maxRecrods silently and read 10,000 records a call."""
    result = copier("check-config", "--offline", str(variant(tmp_path, "maxRecrods = 100")))
    assert result.returncode == 2
    assert "maxRecrods: unknown key: did you mean maxRecords?" in result.stderr


def test_a_misspelt_copier_key_names_the_key_it_resembles(tmp_path: Path) -> None:
    result = copier("check-config", "--offline", str(variant(tmp_path, "copier.dedupKye = json:id")))
    assert result.returncode == 2
    assert "copier.dedupKye: unknown copier key (did you mean copier.dedupKey?)" in result.stderr


def test_a_key_nobody_knows_and_resembles_nothing_is_a_warning(tmp_path: Path) -> None:
    result = copier("check-config", "--offline", str(variant(tmp_path, "teamOwner = payments")))
    assert result.returncode == 0, result.stderr
    assert "warning:" in result.stderr and "teamOwner: unknown to copier and to the KCL" in result.stderr


def test_copier_run_refuses_an_executable_that_does_not_exist_before_the_jvm_starts(tmp_path: Path) -> None:
    """The daemon would fail about a minute later with 'Failed to start client executable', naming no path."""
    path = variant(
        tmp_path, executable=f"/nonexistent/bin/copier process --properties {tmp_path / 'copier.properties'}"
    )
    result = copier("run", "--properties", str(path))
    assert result.returncode == 2
    assert "executableName: /nonexistent/bin/copier does not exist or is not executable" in result.stderr
    assert "MultiLangDaemon" not in result.stderr + result.stdout, "the JVM never started"


def test_copier_run_refuses_processors_with_another_properties_file(tmp_path: Path) -> None:
    other = tmp_path / "other.properties"
    other.write_text(LOCAL.read_text())
    result = copier("run", "--properties", str(variant(tmp_path, executable=f"{COPIER} process --properties {other}")))
    assert result.returncode == 2
    assert f"runs processors with --properties {other}, not this file" in result.stderr


def test_the_lint_finds_a_program_not_on_path_and_passes_one_that_is() -> None:
    text = "executableName = copier process --properties /etc/copier/copier.properties\n"
    missing = lint_properties(text, "/etc/copier/copier.properties", list(COPIER_KEYS), which=lambda _: None)
    assert [f.text for f in missing] == ["copier is not on PATH: the daemon could start no processor"]
    found = lint_properties(
        text, "/etc/copier/copier.properties", list(COPIER_KEYS), which=lambda _: "/x", is_executable=lambda _: True
    )
    assert found == []
    offline = lint_properties(text, "/elsewhere.properties", list(COPIER_KEYS), host=False, which=lambda _: None)
    assert offline == [], "without host checks only the keys are read"
    assert close_key("MAXRECORDS", ["maxRecords"]) == "maxRecords" and close_key("zzz", ["maxRecords"]) is None


def test_check_config_accepts_properties_as_every_other_command_does(tmp_path: Path) -> None:
    by_flag = copier("check-config", "--offline", "--properties", str(variant(tmp_path)))
    assert by_flag.returncode == 0 and ": ok: staging -> target" in by_flag.stdout
    assert copier("--version").stdout.startswith("copier ")


def test_a_missing_state_table_is_named_with_the_command_that_creates_it(pipeline: Pipeline) -> None:
    """Online: the streams exist, the table does not (copier init never ran)."""
    table = f"{pipeline.table}-never-created"
    props = pipeline.write_properties(stateTableName=table)
    result = copier("check-config", str(props))
    assert result.returncode == 3, result
    assert f"the state table {table} does not exist (region us-east-1, endpoint {pipeline.endpoint})" in result.stderr
    assert f"copier init --properties {props}" in result.stderr
    assert result.stderr.count("ResourceNotFoundException") == 1, "seen: AWS's code said twice on the one line"
    assert copier("init", "--properties", str(props)).returncode == 0
    after = copier("check-config", str(props))
    assert after.returncode == 0 and f"state table {table}: exists" in after.stdout


def test_local_commands_need_no_exported_keys_against_a_loopback_backend(pipeline: Pipeline) -> None:
    """copier init against the local backend with no AWS credentials anywhere in the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_CONFIG_FILE"] = env["AWS_SHARED_CREDENTIALS_FILE"] = "/nonexistent"
    table = f"{pipeline.table}-no-keys"
    result = copier("init", "--properties", str(pipeline.write_properties(stateTableName=table)), env=env)
    assert result.returncode == 0, result.stderr
    assert f"state table {table}: created" in result.stdout


def test_export_takes_times_as_it_writes_them_as_iso_and_relative() -> None:
    """export writes epoch milliseconds; --since/--until take them back, ISO 8601 and -2h style too."""
    from copier.commands.export import _instant_ms

    assert _instant_ms("1700000000123") == 1_700_000_000_123
    assert _instant_ms("2023-11-14T22:13:20Z") == _instant_ms("2023-11-14T22:13:20") == 1_700_000_000_000
    assert _instant_ms("-2h", now_ms=10_000_000) == 10_000_000 - 7_200_000
    assert _instant_ms("-30m", now_ms=10_000_000) == 10_000_000 - 1_800_000
    assert _instant_ms("-1d", now_ms=100_000_000) == 100_000_000 - 86_400_000


def test_since_and_until_take_now_in_export_and_repair() -> None:
    """Seen: `copier repair --until now` refused. Both commands parse their times with the one parser."""
    import argparse

    from copier.commands import repair
    from copier.commands.export import _instant_ms

    assert _instant_ms("now", now_ms=10_000_000) == _instant_ms(" NOW ", now_ms=10_000_000) == 10_000_000
    parser = argparse.ArgumentParser()
    repair.add_arguments(parser)
    args = parser.parse_args(["--properties", "p", "--since=-1h", "--until", "now"])
    assert 0 < args.until - args.since <= 3_700_000


def test_a_dry_run_repairs_last_progress_line_says_no_count_before_nothing_put() -> None:
    """Seen: `repair: 0 dry run: nothing put`."""
    from copier.adapters.progress import RunProgress
    from copier.commands import repair

    progress = RunProgress("repair", tty=False)
    assert progress.text(*repair.closing(0, True)) == "repair: dry run: nothing put"
    assert progress.text(*repair.closing(7, False)) == "repair: 7 lost events put"


def test_export_of_a_stream_that_cannot_be_listed_leaves_no_directory(tmp_path: Path) -> None:
    from tests.support.backend import free_port

    path = variant(tmp_path)
    path.write_text(path.read_text().replace("127.0.0.1:4566", f"127.0.0.1:{free_port()}"))  # nobody listens
    out = tmp_path / "export"
    started = time.monotonic()
    result = copier("export", "--properties", str(path), "--stream", "staging", "--out", str(out))
    assert result.returncode == 3, result.stderr
    assert time.monotonic() - started < 15, "a backend nobody answers for fails at once, not after 30 s of retries"
    assert not out.exists(), "nothing written, nothing left behind"


def test_status_names_a_missing_state_table_and_the_command_that_creates_it(pipeline: Pipeline) -> None:
    """Seen: `BatchGetItem failed: ResourceNotFoundException: Requested resource not found`, naming nothing."""
    table = f"{pipeline.table}-absent"
    props = pipeline.write_properties(stateTableName=table)
    result = copier("status", "--properties", str(props))
    assert result.returncode == 3
    assert f"the state table {table} does not exist (region us-east-1, endpoint {pipeline.endpoint})" in result.stderr
    assert f"`copier init --properties {props}`" in result.stderr


def test_check_config_names_a_missing_target_stream_and_the_key(pipeline: Pipeline) -> None:
    props = pipeline.write_properties(targetStreamName="no-such-target")
    result = copier("check-config", str(props))
    assert result.returncode == 3
    assert "the stream no-such-target does not exist (region us-east-1" in result.stderr
    assert f"correct copier.targetStreamName in {props}" in result.stderr


def test_copier_run_refuses_a_missing_target_stream_or_state_table_before_the_jvm_starts(pipeline: Pipeline) -> None:
    """run does check-config's AWS checks first: a missing resource is one line and exit 3, not a daemon that
    retries for minutes and ends in a Java TimeoutException."""
    missing_stream = copier("run", "--properties", str(pipeline.write_properties(targetStreamName="no-such-target")))
    assert missing_stream.returncode == 3, missing_stream.stderr[-2000:]
    assert "the stream no-such-target does not exist (region us-east-1" in missing_stream.stderr
    table = f"{pipeline.table}-never-made"
    missing_table = copier("run", "--properties", str(pipeline.write_properties(stateTableName=table)))
    assert missing_table.returncode == 3, missing_table.stderr[-2000:]
    assert f"the state table {table} does not exist" in missing_table.stderr
    for result in (missing_stream, missing_table):
        assert "MultiLangDaemon" not in result.stderr + result.stdout, "the JVM never started"


def test_check_config_says_what_the_retrieval_mode_means(tmp_path: Path) -> None:
    """POLLING shares the shard's reads; FANOUT registers a consumer, counted against the stream's limit of 20
    and billed apart, and leaves maxRecords unused; a file that leaves the mode to the daemon is told so."""
    polling = copier("check-config", "--offline", str(variant(tmp_path)))
    assert polling.returncode == 0, polling.stderr
    assert "retrieval POLLING: the daemon reads staging with GetRecords, sharing each shard's 5 reads" in polling.stdout
    path = variant(tmp_path)
    path.write_text(path.read_text().replace("retrievalMode = POLLING", "retrievalMode = FANOUT"))
    fanout = copier("check-config", "--offline", str(path))
    assert fanout.returncode == 0, fanout.stderr
    said = fanout.stdout
    assert "retrieval FANOUT: the daemon registers the consumer copier-local on staging" in said
    assert "the stream's limit of 20 consumers" in said and "billed per consumer-shard hour and per GB" in said
    assert "maxRecords and idleTimeBetweenReadsInMillis are not used" in said
    path.write_text(path.read_text().replace("retrievalMode = FANOUT\n", ""))
    implicit = copier("check-config", "--offline", str(path))
    assert "retrieval POLLING (no retrievalMode = POLLING|FANOUT: the daemon's DEFAULT picks it" in implicit.stdout
