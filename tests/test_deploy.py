"""Deployment: the systemd units, the installer, the CloudFormation template and its least-privilege role.

The graceful stop is signalled as systemd signals (SIGTERM to the whole
control group, the default KillMode) and checked in the copier's own logs;
the role is checked against every DynamoDB and Kinesis call a real daemon
and copier made against the recording local backend.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest

from copier.local.pipeline import LocalPipeline
from copier.local.producer import produce
from tests.support.backend import local_backend
from tests.support.iam import ACCOUNT, REGION, Call, allowed, kcl_tables, recorded_calls, role_policy

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
UNITS = ("copier.service", "copier-scale-in.service")


def _verify_unit(unit: Path, root: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """systemd-analyze verify, the unit's /opt/copier and /etc/copier paths moved under ``root``."""
    text = unit.read_text().replace("/opt/copier", f"{root}/opt/copier").replace("/etc/copier", f"{root}/etc/copier")
    checked = tmp_path / unit.name
    checked.write_text(text)
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(checked)], capture_output=True, text=True, timeout=60
    )


def test_the_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    """No error and no warning (an unknown key is only a warning, so any output fails)."""
    root = tmp_path / "root"
    (root / "opt/copier/venv/bin").mkdir(parents=True)
    executable = root / "opt/copier/venv/bin/copier"
    shutil.copy(Path(sys.executable).with_name("copier"), executable)
    for unit in UNITS:
        result = _verify_unit(SCRIPTS / unit, root, tmp_path)
        assert (result.returncode, result.stdout + result.stderr) == (0, ""), unit


def test_systemd_analyze_catches_a_bad_unit(tmp_path: Path) -> None:
    """The check above can fail: a misspelt key is reported."""
    bad = tmp_path / "bad" / "copier.service"
    bad.parent.mkdir()
    bad.write_text((SCRIPTS / "copier.service").read_text().replace("KillMode=", "KillMod="))
    result = _verify_unit(bad, tmp_path, tmp_path)
    assert "Unknown key" in result.stderr


def test_the_unit_stops_gracefully_as_the_daemon_expects() -> None:
    """KillMode=mixed and TimeoutStopSec above the properties' shutdownGraceMillis plus a put."""
    unit = (SCRIPTS / "copier.service").read_text()
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    properties = (ROOT / "properties" / "copier.properties").read_text()
    grace_ms = int(next(line.split("=")[1] for line in properties.splitlines() if line.startswith("shutdownGrace")))
    assert settings["KillMode"] == "mixed" and settings["Restart"] == "always"
    assert settings["StartLimitIntervalSec"] == "0", "never gives up restarting"
    assert int(settings["TimeoutStopSec"].rstrip("s")) * 1000 > grace_ms + 5000


def test_the_templates_pass_cfn_lint() -> None:
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("cfn-lint")),
            str(SCRIPTS / "copier.yaml"),
            str(SCRIPTS / "copier-target-role.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_policy_check_refuses_what_the_role_does_not_grant() -> None:
    """The evaluator can say no: other tables, other streams, other actions."""
    policy = role_policy({"ApplicationName": "app", "StagingStreamName": "s", "TargetStreamName": "t"})
    table = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/"
    stream = f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/"
    assert allowed(policy, Call("dynamodb:PutItem", table + "app-copier-state"))
    assert allowed(policy, Call("kinesis:PutRecords", stream + "t"))
    assert not allowed(policy, Call("dynamodb:DeleteTable", table + "app-copier-state"))
    assert not allowed(policy, Call("dynamodb:PutItem", table + "other"))
    assert not allowed(policy, Call("kinesis:PutRecords", stream + "s")), "staging is read-only"
    assert not allowed(policy, Call("kinesis:PutRecords", stream + "deadletter")), "no dead-letter stream given"
    assert not any(s["Action"] == "*" or s["Action"] == ["*"] for s in policy)


def test_with_a_target_role_the_instance_role_only_assumes_it() -> None:
    """Cross-account: sts:AssumeRole on the target role, no direct access to a target stream; the target
    role (scripts/copier-target-role.yaml) trusts the instance role only with the external ID."""
    from cfnlint.decode import decode_str

    role = "arn:aws:iam::111111111111:role/copier-target"
    policy = role_policy(
        {"ApplicationName": "app", "StagingStreamName": "s", "TargetStreamName": "t", "TargetRoleArn": role}
    )
    assert allowed(policy, Call("sts:AssumeRole", role))
    assert not allowed(policy, Call("sts:AssumeRole", "arn:aws:iam::111111111111:role/other"))
    assert not allowed(policy, Call("kinesis:PutRecords", f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/t"))
    template, problems = decode_str((SCRIPTS / "copier-target-role.yaml").read_text())
    assert not problems
    trust = template["Resources"]["TargetRole"]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert [(t["Principal"]["AWS"], t["Condition"]["StringEquals"]["sts:ExternalId"]) for t in trust] == [
        ({"Ref": "CopierInstanceRoleArn"}, {"Ref": "ExternalId"})
    ]


@pytest.mark.protocol
@pytest.mark.timeout(600)
def test_the_role_allows_every_call_of_a_real_run_and_sigterm_to_the_group_is_graceful(tmp_path: Path) -> None:
    """A daemon and its processors copy, reshard and stop as systemd stops them; the role covers every call.

    SIGTERM goes to the whole process group, as systemd's default
    KillMode=control-group sends it: processors ignore it and leave the stop to
    the daemon, so each gets shutdown_requested, checkpoints and releases.
    """
    recording = tmp_path / "recording.jsonl"
    with local_backend(MOTO_ENABLE_RECORDING="True", MOTO_RECORDER_FILEPATH=str(recording)) as endpoint:
        pipeline = LocalPipeline(
            endpoint,
            tmp_path / "run",
            staging="iam-staging",
            target="iam-target",
            application="iam-app",
            copier={"unkeyedPolicy": "deadletter", "deadLetterStreamName": "iam-deadletter"},
        )
        try:
            pipeline.create(staging_shards=2, target_shards=2)
            pipeline.kinesis.create_stream(StreamName="iam-deadletter", ShardCount=1)
            # The KCL's tables as the template creates them: the role has no CreateTable.
            dynamodb = boto3.session.Session().client("dynamodb", region_name=REGION, endpoint_url=endpoint)
            for request in kcl_tables({"ApplicationName": "iam-app"}):
                dynamodb.create_table(**request)
            produced = produce(pipeline.kinesis, pipeline.staging, 400, run="iam", seed=1)
            pipeline.kinesis.put_record(StreamName=pipeline.staging, Data=b"not json", PartitionKey="poison")
            worker = pipeline.start_worker("a")
            assert pipeline.wait(lambda: pipeline.caught_up(produced.last), 240), f"see the logs in {tmp_path}"
            children = pipeline.split(sorted(pipeline.shard_states())[0])
            produce(pipeline.kinesis, pipeline.staging, 400, run="iam", seed=2, start=400, out=produced)
            assert pipeline.wait(lambda: pipeline.caught_up(produced.last), 240), f"see the logs in {tmp_path}"
            status = subprocess.run(
                [pipeline.copier_bin, "status", "--properties", str(pipeline.properties)],
                capture_output=True,
                text=True,
                env={**os.environ, **{"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}},
                timeout=60,
            )
            assert status.returncode == 0, status.stderr
            # The verification read of the target (a successor's, after an ambiguous put): the adapter's own path.
            from copier.adapters.kinesis import KinesisStreams
            from copier.core.identity import identity_of

            KinesisStreams(pipeline.config).read_identities(
                pipeline.target, None, 0, None, lambda pk, data: identity_of(pipeline.config.dedup_key, pk, data)
            )

            owned = pipeline.shards_owned().get("a", 0)
            assert owned >= 2
            os.killpg(worker.proc.pid, signal.SIGTERM)  # systemd's KillMode=control-group
            assert worker.proc.wait(timeout=60) == 0, "a requested stop is a clean exit"
            log = worker.log_path.read_text()
            assert log.count('"event": "released"') >= owned, "every processor running released its shard"
            assert "Child process failed to complete shutdown notification" not in log

            # A daemon stopping may hand a shard to a new processor just before it exits (KCL 3 takes its own
            # released lease back); that processor gives the lease up when its input closes, moments later.
            def leases() -> dict[str, int]:
                return {k: s.lease_until_ms for k, s in pipeline.shard_states().items() if k in children}

            assert pipeline.wait(lambda: not any(leases().values()), 20), f"leases not given up: {leases()}"
        finally:
            pipeline.stop_all()

    calls = recorded_calls(recording.read_text().splitlines())
    used = {c.action for c in calls}
    assert {"kinesis:PutRecords", "kinesis:GetRecords", "dynamodb:PutItem", "dynamodb:Query"} <= used
    assert any(c.resource.endswith("table/iam-app") for c in calls), "the KCL's own calls are in the recording"
    policy = role_policy(
        {
            "ApplicationName": "iam-app",
            "StagingStreamName": "iam-staging",
            "TargetStreamName": "iam-target",
            "DeadLetterStreamName": "iam-deadletter",
        }
    )
    # The test's own calls, not the service's: creating the streams, writing and splitting staging (the
    # producer), creating the tables (copier init and the test here, the template's tables in AWS).
    arn = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/iam-app-copier-state"
    setup = {"kinesis:CreateStream", "kinesis:DescribeStream", "kinesis:PutRecord", "kinesis:SplitShard"}
    setup_calls = {
        Call("kinesis:PutRecords", f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/iam-staging"),
        Call("dynamodb:CreateTable", arn),
        Call("dynamodb:UpdateTimeToLive", arn),
        *(
            Call("dynamodb:CreateTable", arn.replace("iam-app-copier-state", r["TableName"]))
            for r in kcl_tables({"ApplicationName": "iam-app"})
        ),
    }
    refused = sorted(
        (c.action, c.resource)
        for c in calls
        if c.action not in setup and c not in setup_calls and not allowed(policy, c)
    )
    assert refused == [], f"calls the instance role would refuse: {refused}"


# --- Security review (issue 24): unit exposure, checkov, the template's boundary and encryption -------------


def _exposure(unit: Path) -> float:
    """systemd-analyze security's overall exposure of a unit file (0 best, 10 worst)."""
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d)", result.stdout + result.stderr)
    assert match, result.stdout + result.stderr
    return float(match.group(1))


@pytest.mark.parametrize("unit", UNITS)
def test_each_unit_scores_at_most_2_5_in_systemd_analyze_security(unit: str) -> None:
    """Measured, not claimed: copier.service was 6.5 (MEDIUM) and copier-scale-in.service 8.9 (EXPOSED)."""
    assert _exposure(SCRIPTS / unit) <= 2.5


def test_the_exposure_measure_can_fail(tmp_path: Path) -> None:
    """A unit without the hardening scores high: the check above measures something."""
    bare = tmp_path / "bare.service"
    bare.write_text("[Service]\nExecStart=/bin/true\n")
    assert _exposure(bare) > 9


def test_the_jvm_may_write_then_execute_and_nothing_else_is_relaxed() -> None:
    """The JIT needs writable executable memory (copier.service); the scale-in watcher does not."""
    service = (SCRIPTS / "copier.service").read_text()
    scale_in = (SCRIPTS / "copier-scale-in.service").read_text()
    assert "MemoryDenyWriteExecute" not in re.sub(r"#.*", "", service)
    assert "MemoryDenyWriteExecute=yes" in scale_in
    for text in (service, scale_in):
        for line in ("CapabilityBoundingSet=\n", "SystemCallFilter=@system-service\n", "UMask=0077\n"):
            assert line in text
    assert "Restart=on-failure" in scale_in, "a completed scale-in is not run again"


def _checkov() -> str:
    """checkov lives in a virtualenv of its own (make install-test: .venv/checkov), or $COPIER_CHECKOV."""
    path = os.environ.get("COPIER_CHECKOV") or str(ROOT / ".venv" / "checkov" / "bin" / "checkov")
    assert Path(path).is_file(), f"{path} missing: make install-test puts checkov there"
    return path


def test_checkov_finds_nothing_to_fix_in_the_templates() -> None:
    """Every check checkov has for these resources passes (an accepted failure would be skipped, with its
    reason, in the resource's Metadata: there is none)."""
    result = subprocess.run(
        [
            _checkov(),
            "--framework",
            "cloudformation",
            "--skip-download",
            "--quiet",
            "--compact",
            "-o",
            "json",
            "-f",
            str(SCRIPTS / "copier.yaml"),
            "-f",
            str(SCRIPTS / "copier-target-role.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"},
    )
    report = json.loads(result.stdout)
    summary = report["summary"] if isinstance(report, dict) else report[0]["summary"]
    assert (summary["failed"], summary["parsing_errors"]) == (0, 0), result.stdout
    assert summary["passed"] >= 27, summary
    assert summary["skipped"] == 0, "a skip needs its reason here and in docs/operations.md"


def _template() -> dict[str, Any]:
    from cfnlint.decode import decode_str

    template, problems = decode_str((SCRIPTS / "copier.yaml").read_text())
    assert not problems
    return dict(template)


def test_the_hosts_accept_no_connection_and_may_only_open_https() -> None:
    """Own security group: no ingress; egress TCP 443 only; no public IP; Session Manager; no sshd."""
    template = _template()
    resources = template["Resources"]
    group = resources["HostSecurityGroup"]["Properties"]
    assert "SecurityGroupIngress" not in group
    assert not [r for r in resources.values() if r["Type"] == "AWS::EC2::SecurityGroupIngress"]
    egress = group["SecurityGroupEgress"] + [
        r["Properties"] for r in resources.values() if r["Type"] == "AWS::EC2::SecurityGroupEgress"
    ]
    assert {(e["IpProtocol"], e["FromPort"], e["ToPort"]) for e in egress} == {("tcp", 443, 443)}
    data = resources["LaunchTemplate"]["Properties"]["LaunchTemplateData"]
    (interface,) = data["NetworkInterfaces"]
    assert interface["AssociatePublicIpAddress"] is False
    assert interface["Groups"] == [{"Fn::GetAtt": ["HostSecurityGroup", "GroupId"]}]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert "KeyName" not in data
    assert any(
        "AmazonSSMManagedInstanceCore" in str(a) for a in resources["InstanceRole"]["Properties"]["ManagedPolicyArns"]
    )
    user_data = (SCRIPTS / "copier.yaml").read_text().split("UserData:")[1]
    assert "systemctl disable --now sshd.service" in user_data


def test_everything_at_rest_is_encrypted_and_kept() -> None:
    """Four tables (the KCL's three among them) with KMS, PITR and deletion protection; encrypted EBS; log groups
    with retention and the data key; the role cannot create tables or log groups."""
    resources = _template()["Resources"]
    tables = {name: r["Properties"] for name, r in resources.items() if r["Type"] == "AWS::DynamoDB::Table"}
    assert set(tables) == {"StateTable", "KclLeaseTable", "KclWorkerMetricsTable", "KclCoordinatorStateTable"}
    for name, table in tables.items():
        assert table["SSESpecification"]["SSEEnabled"] is True and table["SSESpecification"]["SSEType"] == "KMS", name
        assert table["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}, name
        assert table["DeletionProtectionEnabled"] is True, name
        assert resources[name]["DeletionPolicy"] == "Retain", name
    (volume,) = resources["LaunchTemplate"]["Properties"]["LaunchTemplateData"]["BlockDeviceMappings"]
    assert volume["Ebs"]["Encrypted"] is True
    groups = {name: r["Properties"] for name, r in resources.items() if r["Type"] == "AWS::Logs::LogGroup"}
    assert set(groups) == {"AuditLogGroup", "MetricsLogGroup"}
    for group in groups.values():
        assert group["RetentionInDays"] == {"Ref": "LogRetentionDays"} and "KmsKeyId" in group
    assert min(_template()["Parameters"]["LogRetentionDays"]["AllowedValues"]) >= 365
    policy = role_policy({"ApplicationName": "app", "StagingStreamName": "s", "TargetStreamName": "t"})
    actions = {a for s in policy for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert not {"dynamodb:CreateTable", "dynamodb:UpdateTable", "logs:CreateLogGroup"} & actions


def test_the_stream_keys_are_usable_through_kinesis_for_their_own_stream_only() -> None:
    """kms:ViaService and the Kinesis encryption context on every key grant; staging may only Decrypt."""
    key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    policy = role_policy(
        {
            "ApplicationName": "app",
            "StagingStreamName": "s",
            "TargetStreamName": "t",
            "DeadLetterStreamName": "d",
            "StagingKmsKeyArn": key,
            "TargetKmsKeyArn": key.replace("1234abcd", "5678abcd"),
        }
    )
    grants = {s["Sid"]: s for s in policy if str(s["Action"]).count("kms:")}
    assert set(grants) == {"StagingStreamKey", "TargetStreamKey"}
    assert grants["StagingStreamKey"]["Action"] == "kms:Decrypt"
    for grant in grants.values():
        condition = grant["Condition"]["StringEquals"]
        assert condition["kms:ViaService"] == f"kinesis.{REGION}.amazonaws.com"
    stream = f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/"
    assert (
        grants["StagingStreamKey"]["Condition"]["StringEquals"]["kms:EncryptionContext:aws:kinesis:arn"] == stream + "s"
    )
    assert grants["TargetStreamKey"]["Condition"]["StringEquals"]["kms:EncryptionContext:aws:kinesis:arn"] == [
        stream + "t",
        stream + "d",
    ]


def test_every_alarm_notifies_the_topic_and_the_audit_log_is_shipped() -> None:
    template = _template()
    alarms = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::CloudWatch::Alarm"]
    assert alarms and all(a["AlarmActions"] == [{"Ref": "AlarmTopicArn"}] for a in alarms)
    assert "Default" not in template["Parameters"]["AlarmTopicArn"], "no deployment without someone to tell"
    user_data = (SCRIPTS / "copier.yaml").read_text().split("UserData:")[1]
    assert '"file_path": "/var/log/copier/copier.log", "log_group_name": "${ApplicationName}-audit"' in user_data
    rsyslog = (SCRIPTS / "copier-rsyslog.conf").read_text()
    assert 'file="/var/log/copier/copier.log"' in rsyslog and '"copier-scale-in.service"' in rsyslog


def test_the_bundle_is_verified_before_anything_of_it_runs() -> None:
    """SHA-256 (a parameter) and the bucket owner checked before unpacking; owners not kept from the archive."""
    user_data = (SCRIPTS / "copier.yaml").read_text().split("UserData:")[1]
    order = [
        user_data.index('--expected-bucket-owner "${BucketOwner}"'),
        user_data.index('echo "${ReleaseSha256}  bundle.tar.gz" | sha256sum --check --strict'),
        user_data.index("tar xzf bundle.tar.gz --strip-components=1 --no-same-owner"),
        user_data.index("./scripts/install.sh --bundle"),
    ]
    assert order == sorted(order)


# --- The dashboard and the alarms name what copier emits (issue 44) -------------------------------------------

APPLICATION, NAMESPACE, REGION_HERE = "app-1", "ns-test", "eu-west-1"


def _emitted() -> dict[str, set[frozenset[str]]]:
    """Each metric copier emits, with the dimension sets it is emitted under: the documents a real EmfEmitter
    sends for ``copier.adapters.metrics.sample_values()`` (an interval in which a shard did everything once),
    read back from an agent."""
    import time

    from copier.adapters.metrics import EmfEmitter, metric_names, sample_values
    from tests.support.fakes import config
    from tests.support.serving import EmfAgent, serving

    values, retries = sample_values()
    with serving(EmfAgent()) as agent:
        cfg = config(metrics="emf", metricsAgentEndpoint=f"tcp://127.0.0.1:{agent.server_address[1]}")
        EmfEmitter(cfg, worker="host-a").emit("shardId-000000000000", values, retries)
        deadline = time.monotonic() + 20
        while len(agent.lines) < 1 + len(retries):
            assert time.monotonic() < deadline, "the agent received the documents"
            time.sleep(0.01)
        docs = [json.loads(line) for line in agent.lines]
    found: dict[str, set[frozenset[str]]] = {}
    for doc in docs:
        for directive in doc["_aws"]["CloudWatchMetrics"]:
            for metric in directive["Metrics"]:
                found.setdefault(metric["Name"], set()).update(frozenset(d) for d in directive["Dimensions"])
    assert set(found) == metric_names()
    return found


def _substituted(text: str, template: dict[str, Any]) -> str:
    """A Fn::Sub string with every ``${...}`` resolved: the application and namespace to test values, the other
    parameters to their defaults, pseudo parameters, and ``${Resource.Arn}`` of a resource of the template (a
    name that is none of these raises KeyError: CloudFormation would refuse it)."""
    values = {"AWS::Region": REGION_HERE, "AWS::AccountId": "123456789012", "AWS::StackName": "stack"}
    values |= {name: str(p["Default"]) for name, p in template["Parameters"].items() if "Default" in p}
    values |= {"ApplicationName": APPLICATION, "MetricsNamespace": NAMESPACE}

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name.startswith("!"):  # ${!Literal}
            return "${" + name[1:] + "}"
        if "." in name:
            resource, _ = name.split(".", 1)
            assert resource in template["Resources"], name
            return f"arn:aws:cloudwatch:{REGION_HERE}:123456789012:alarm:{resource}"
        return values[name]

    return re.sub(r"\$\{([^}]*)\}", one, text)


def _dashboard_body(template: dict[str, Any]) -> dict[str, Any]:
    body = template["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    parsed: dict[str, Any] = json.loads(_substituted(body, template))
    return parsed


def _widget_metrics(widget: dict[str, Any]) -> tuple[list[tuple[str, str, dict[str, str]]], list[str]]:
    """A metric widget's metrics as (namespace, name, dimensions), those a SEARCH finds with the dimension values
    its filter gives, and the problems of its expressions (an id that is not the widget's)."""
    metrics: list[tuple[str, str, dict[str, str]]] = []
    problems: list[str] = []
    entries = widget["properties"]["metrics"]
    ids = {e[-1]["id"] for e in entries if isinstance(e[-1], dict) and "id" in e[-1]}
    previous: list[str] = []
    for entry in entries:
        options = entry[-1] if isinstance(entry[-1], dict) else {}
        parts = list(entry[:-1] if options else entry)
        if parts:
            parts = [previous[i] if part == "." else part for i, part in enumerate(parts)]
            previous = parts
            namespace, name, *dims = parts
            metrics.append((namespace, name, dict(zip(dims[0::2], dims[1::2], strict=True))))
            continue
        expression = options["expression"]
        searches = re.findall(r"SEARCH\('\{([^}]*)\} ([^']*)'", expression)
        for schema, terms in searches:
            namespace, *dimensions = schema.split(",")
            filters = dict(re.findall(r'(\w+)="([^"]*)"', terms))
            name = filters.pop("MetricName", "")
            metrics.append((namespace, name, {d: filters.get(d, "*") for d in dimensions}))
        if not searches:
            problems += [
                f"{word} is no id of the widget" for word in re.findall(r"\b[a-z]\w*", expression) if word not in ids
            ]
    return metrics, problems


def _dashboard_problems(body: dict[str, Any], emitted: dict[str, set[frozenset[str]]]) -> list[str]:
    """What in a dashboard body names a metric copier does not emit (a name, a namespace, a set of dimensions, an
    application), an expression's unknown id, or overlapping widgets."""
    problems: list[str] = []
    cells: set[tuple[int, int]] = set()
    for widget in body["widgets"]:
        area = {
            (x, y)
            for x in range(widget["x"], widget["x"] + widget["width"])
            for y in range(widget["y"], widget["y"] + widget["height"])
        }
        problems += [f"widget at {widget['x']},{widget['y']} overlaps another"] if area & cells else []
        problems += (
            [f"widget at {widget['x']},{widget['y']} is wider than the grid"]
            if widget["x"] + widget["width"] > 24
            else []
        )
        cells |= area
        if widget["type"] != "metric":
            continue
        assert widget["properties"]["region"] == REGION_HERE
        metrics, expression_problems = _widget_metrics(widget)
        problems += expression_problems
        for namespace, name, dimensions in metrics:
            if namespace != NAMESPACE:
                problems.append(f"{name}: namespace {namespace}")
            if frozenset(dimensions) not in emitted.get(name, set()):
                problems.append(f"{name} under {sorted(dimensions)}: copier emits no such metric")
            if dimensions.get("Application") != APPLICATION:
                problems.append(f"{name}: not this application's")
    return problems


def test_the_dashboard_shows_only_metrics_copier_emits_one_row_per_concern() -> None:
    """The dashboard body, rendered from the template (its Fn::Sub resolved with test values), is JSON; every
    metric it names (directly or in a SEARCH) is one copier emits, under dimensions it emits it with, in the
    stack's namespace and application; rows do not overlap; each concern the runbook watches has its row; the
    alarm widget shows every alarm of the template."""
    template = _template()
    body = _dashboard_body(template)
    emitted = _emitted()
    assert _dashboard_problems(body, emitted) == []
    named = {name for w in body["widgets"] if w["type"] == "metric" for _, name, _ in _widget_metrics(w)[0]}
    concerns = {"RecordAgeMax", "MillisBehindLatest", "EventsForwarded", "DuplicatesDropped", "DeadLettered"}
    assert concerns | {"ShardStalled", "PossibleDuplicates", "ClockBoundMs"} <= named
    alarms = {name for name, r in template["Resources"].items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    (shown,) = [w["properties"]["alarms"] for w in body["widgets"] if w["type"] == "alarm"]
    assert {arn.rsplit(":", 1)[1] for arn in shown} == alarms


def test_the_dashboard_check_finds_a_metric_copier_does_not_emit() -> None:
    """The check above can fail: a misspelt name, metrics under dimensions copier never uses, another namespace."""
    template = _template()
    emitted = _emitted()
    text = json.dumps(_dashboard_body(template))
    misspelt = json.loads(text.replace('"RecordAgeP99"', '"RecordAgeP95"'))
    assert _dashboard_problems(misspelt, emitted) == ["RecordAgeP95 under ['Application']: copier emits no such metric"]
    regrouped = json.loads(text.replace(",Application,ShardId}", ",Application,WorkerId,ShardId}"))
    assert any("copier emits no such metric" in p for p in _dashboard_problems(regrouped, emitted))
    elsewhere = json.loads(text.replace(f'"{NAMESPACE}"', '"AWS/Kinesis"'))
    assert any("namespace AWS/Kinesis" in p for p in _dashboard_problems(elsewhere, emitted))


def test_every_alarm_watches_a_metric_copier_emits() -> None:
    """Each alarm's metric is one copier emits, in the stack's namespace, under dimensions it emits it with; the
    record age alarm watches RecordAgeMax against its own parameter."""
    template = _template()
    emitted = _emitted()
    alarms = {
        name: r["Properties"] for name, r in template["Resources"].items() if r["Type"] == "AWS::CloudWatch::Alarm"
    }
    for name, alarm in alarms.items():
        assert alarm["Namespace"] == {"Ref": "MetricsNamespace"}, name
        dimensions = frozenset(d["Name"] for d in alarm["Dimensions"])
        assert dimensions in emitted.get(alarm["MetricName"], set()), (name, alarm["MetricName"], dimensions)
    age = alarms["RecordAgeAlarm"]
    assert (age["MetricName"], age["Statistic"], age["Threshold"]) == (
        "RecordAgeMax",
        "Maximum",
        {"Ref": "RecordAgeAlarmMillis"},
    )
