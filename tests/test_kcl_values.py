"""The values of the keys only the KCL daemon reads are checked against the daemon's own types (issue 45, item 7).

``shardSyncIntervalMillis = 1s`` passed check-config and run: the KCL 3.1.3 daemon reads a number it cannot
parse as 0 and a boolean as false without a word (Apache BeanUtils' converters), and fails at its start on an
enumeration or a duration it cannot parse. The table (``copier.core.kclkeys``) is checked here against the
daemon's own configurator, run on the jars copier ships; the commands against their output.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from copier.core.kclkeys import KCL_TYPES, kcl_value_problem
from copier.kcl.jars import jars
from tests.support.backend import DUMMY_ENV, ROOT

COPIER = str(ROOT / ".venv" / "bin" / "copier")
LOCAL = ROOT / "properties" / "local.properties"

# A value the daemon reads as written, and one it cannot parse, for each type.
GOOD = {"long": "1500", "int": "7", "double": "0.5", "boolean": "yes", "duration": "PT1H", "epochSeconds": "1700000000"}
BAD = {"long": "1s", "int": "1e3", "double": "lots", "boolean": "maybe", "duration": "1d", "epochSeconds": "soon"}

# Sets each key=value line of its standard input on the daemon's configuration, as the daemon does, and prints
# what the configuration then holds, or THROWS.
READER = """
import java.io.*;
import java.util.Properties;
import software.amazon.kinesis.multilang.config.*;
public class ReadAsTheDaemon {
  public static void main(String[] a) throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
    for (String line; (line = in.readLine()) != null; ) {
      String key = line.substring(0, line.indexOf('=')), value = line.substring(line.indexOf('=') + 1);
      Properties p = new Properties();
      p.setProperty("applicationName", "a"); p.setProperty("streamName", "s");
      p.setProperty("AwsCredentialsProvider", "DefaultCredentialsProvider");
      p.setProperty(key, value);
      try {
        Object conf = new KinesisClientLibConfigurator().getConfiguration(p);
        Object read = org.apache.commons.beanutils.PropertyUtils.getProperty(conf, key);
        System.out.println("READ\\t" + key + "\\t" + read);
      } catch (Throwable t) {
        System.out.println("READ\\t" + key + "\\tTHROWS");
      }
    }
  }
}
"""


def _kind(key: str) -> str:
    kind = KCL_TYPES[key]
    return "enum" if kind.startswith("enum:") else kind


def _samples(good: bool) -> dict[str, str]:
    out = {}
    for key, kind in KCL_TYPES.items():
        if kind == "text" or key == "initialPositionInStreamExtended":  # read back through another property
            continue
        if kind.startswith("enum:"):
            out[key] = kind.removeprefix("enum:").split("|")[0].lower() if good else "NOPE"
        else:
            out[key] = (GOOD if good else BAD)[kind]
    return out


def _read_by_the_daemon(values: dict[str, str], tmp_path: Path) -> dict[str, str]:
    java = shutil.which("java")
    assert java, "Java 17 is on every machine the tests run on"
    source = tmp_path / "ReadAsTheDaemon.java"
    source.write_text(READER)
    result = subprocess.run(
        [java, "-Dlogback.configurationFile=/nonexistent", "-cp", os.pathsep.join(map(str, jars())), str(source)],
        input="".join(f"{k}={v}\n" for k, v in values.items()),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    read = [line.split("\t")[1:] for line in result.stdout.splitlines() if line.startswith("READ\t")]  # not the log
    return {key: value for key, value in read}


@pytest.mark.timeout(180)
def test_the_table_agrees_with_the_daemons_own_configurator(tmp_path: Path) -> None:
    """Every value the table accepts is read by the daemon as written; every value it refuses is read as 0 or
    false, or stops the daemon: the types are the daemon's, key by key."""
    good, bad = _samples(True), _samples(False)
    read_good = _read_by_the_daemon(good, tmp_path)
    read_bad = _read_by_the_daemon(bad, tmp_path)
    assert set(read_good) == set(good), "every key is one the daemon's configuration has"
    for key, value in good.items():
        assert kcl_value_problem(key, value) is None, key
        expected = {"yes": "true", "0.5": "0.5", "PT1H": "PT1H"}.get(value, value)
        assert read_good[key].lower() == expected.lower(), (key, value, read_good[key])
    for key, value in bad.items():
        assert kcl_value_problem(key, value) is not None, key
        kind = _kind(key)
        if kind in ("long", "int", "double"):
            assert read_bad[key] in ("0", "0.0"), (key, read_bad[key])
        elif kind == "boolean":
            assert read_bad[key] == "false", (key, read_bad[key])
        else:
            assert read_bad[key] == "THROWS", (key, read_bad[key])


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        (
            "shardSyncIntervalMillis",
            "1s",
            "not a whole number: the KCL daemon would read it as 0 without a word; give "
            "digits only (in milliseconds: 1000)",
        ),
        ("maxRecords", "10k", "not a whole number: the KCL daemon would read it as 0 without a word; give digits only"),
        ("maxRecords", "99999999999", "99999999999 is out of the range of a Java number"),
        (
            "cleanupLeasesUponShardCompletion",
            "maybe",
            "not true or false: the KCL daemon would read it as false without a word",
        ),
        ("metricsLevel", "LOUD", "expected one of NONE, SUMMARY, DETAILED: the KCL daemon would fail at its start"),
        (
            "staleWorkerMetricsEntryCleanupDuration",
            "P",
            "not an ISO-8601 duration such as PT1H or P1D: the KCL daemon would fail at its start",
        ),
        ("idleTimeBetweenReadsInMillis", " 200 ", None),
        ("metricslevel", "summary", None),
        ("streamName", "anything at all", None),
        ("teamOwner", "x", None),
    ],
)
def test_each_kcl_value_is_judged_by_its_type(key: str, value: str, problem: str | None) -> None:
    assert kcl_value_problem(key, value) == problem


def _variant(tmp_path: Path, *extra: str) -> Path:
    """properties/local.properties naming itself in executableName, each of ``extra`` (``key = value``) in place
    of that key's line, or added."""
    path = tmp_path / "copier.properties"
    given = {line.split("=")[0].strip(): line for line in extra}
    lines = [f"executableName = {COPIER} process --properties {path}"]
    for line in LOCAL.read_text().splitlines():
        key = line.split("=")[0].strip()
        if key != "executableName":
            lines.append(given.pop(key, line))
    path.write_text("\n".join([*lines, *given.values()]) + "\n")
    return path


def _line_of(path: Path, key: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(key + " "))


def _copier(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("INVOCATION_ID", "JOURNAL_STREAM")}
    return subprocess.run([COPIER, *args], capture_output=True, text=True, env={**env, **DUMMY_ENV}, timeout=120)


def test_a_kcl_value_the_daemon_cannot_parse_stops_check_config_and_run_naming_its_line(tmp_path: Path) -> None:
    """``shardSyncIntervalMillis = 1s`` (the issue's case) is exit 2 with the file, the line, the key and what the
    daemon would do, before anything else; check-config prints no ``ok``."""
    path = _variant(tmp_path, "shardSyncIntervalMillis = 1s")
    line = _line_of(path, "shardSyncIntervalMillis")
    expected = (
        f"copier: {path}:{line}: shardSyncIntervalMillis: '1s': not a whole number: the KCL daemon would "
        "read it as 0 without a word; give digits only (in milliseconds: 1000)"
    )
    for command in (["check-config", "--offline", str(path)], ["run", "--properties", str(path)]):
        result = _copier(*command)
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [expected] and result.stdout == ""


def test_a_bad_copier_value_is_named_with_its_line_as_a_bad_key_is(tmp_path: Path) -> None:
    path = _variant(tmp_path, "copier.putTimeoutMillis = 2s")
    result = _copier("check-config", "--offline", str(path))
    assert result.returncode == 2
    line = _line_of(path, "copier.putTimeoutMillis")
    assert result.stderr == f"copier: {path}:{line}: copier.putTimeoutMillis: expected a whole number, got '2s'\n"


def test_check_config_says_ok_only_once_everything_it_checked_passed(tmp_path: Path) -> None:
    """It printed ``ok:`` first and then failed with exit 3 on an AWS check (issue 45): now ``ok`` is last, and
    a failure leaves it out."""
    from tests.support.backend import free_port

    path = _variant(tmp_path)
    path.write_text(path.read_text().replace("127.0.0.1:4566", f"127.0.0.1:{free_port()}"))  # nobody listens
    failed = _copier("check-config", str(path))
    assert failed.returncode == 3 and "ok:" not in failed.stdout + failed.stderr
    passed = _copier("check-config", "--offline", str(path))
    assert passed.returncode == 0 and passed.stdout.splitlines()[-1].startswith(f"{path}: ok: staging -> target")


def test_check_config_warns_of_a_lease_that_does_not_hold_on_a_loaded_host_with_the_rule(tmp_path: Path) -> None:
    """properties/local.properties' 3 s lease (from failoverTimeMillis) against a 1 s put timeout: a processor
    on a loaded machine reported 136 events as possible duplicates (issue 45, item 12). check-config says the
    rule and its numbers; the samples as shipped pass it."""
    short = _variant(tmp_path, "copier.leaseMillis = 3000")
    result = _copier("check-config", "--offline", str(short))
    assert result.returncode == 0
    (line,) = [n for n, text in enumerate(short.read_text().splitlines(), 1) if text.startswith("copier.leaseMillis")]
    assert result.stderr.splitlines() == [
        f"copier: warning: {short}:{line}: the copier lease (3000 ms: copier.leaseMillis, by default "
        "failoverTimeMillis) is not well above "
        "copier.putTimeoutMillis + copier.clockSkewMillis: a lease should be at least putTimeoutMillis + "
        "max(clockSkewMillis, 1000 ms: a clock bound measured from few answers) + 1000 ms (a renewal's write on a "
        "loaded host) + 1000 ms (to forward in between renewals) = 1000 + 1000 + 1000 + 1000 = 4000 ms, or every "
        "put waits for a renewal and a slow one lets the lease run short; set copier.leaseMillis = 4000 or more"
    ]
    shipped = _copier("check-config", "--offline", str(_variant(tmp_path)))
    assert shipped.returncode == 0 and shipped.stderr == ""
    production = _copier("check-config", "--offline", str(ROOT / "properties" / "copier.properties"))
    assert production.returncode == 0 and "lease" not in production.stderr
