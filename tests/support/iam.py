"""The instance role's policy from scripts/copier.yaml, and the AWS calls a backend recorded, compared.

Enough of CloudFormation (Ref, Sub, GetAtt, If, Join, conditions) and of IAM
evaluation (Allow statements, wildcard actions and resources; conditions
are not evaluated, so a call is allowed here if its statement would allow it
under some condition) to say which recorded calls the role would refuse.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import re
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cfnlint.decode import decode_str

TEMPLATE = Path(__file__).resolve().parents[2] / "scripts" / "copier.yaml"
REGION = "us-east-1"
ACCOUNT = "123456789012"
NO_VALUE = object()


@dataclass(frozen=True)
class Call:
    action: str  # service:Operation
    resource: str  # the ARN the call acts on ("*" when it has none)


def _resolve(node: Any, refs: Mapping[str, Any], conditions: Mapping[str, bool], attrs: Mapping[str, str]) -> Any:
    if isinstance(node, list):
        out = [_resolve(n, refs, conditions, attrs) for n in node]
        return [n for n in out if n is not NO_VALUE]
    if not isinstance(node, dict):
        return node
    if len(node) == 1:
        ((key, value),) = node.items()
        if key == "Ref":
            return NO_VALUE if value == "AWS::NoValue" else refs[value]
        if key == "Fn::GetAtt":
            return attrs[".".join(value) if isinstance(value, list) else value]
        if key == "Fn::If":
            name, yes, no = value
            return _resolve(yes if conditions[name] else no, refs, conditions, attrs)
        if key == "Fn::Join":
            sep, parts = value
            return sep.join(str(p) for p in _resolve(parts, refs, conditions, attrs))
        if key == "Fn::Sub":
            text, extra = (value, {}) if isinstance(value, str) else value
            names = {**refs, **{k: _resolve(v, refs, conditions, attrs) for k, v in extra.items()}}
            return re.sub(r"\$\{([^}]+)\}", lambda m: str(names.get(m.group(1), attrs.get(m.group(1), ""))), text)
    return {k: v for k, v in ((k, _resolve(v, refs, conditions, attrs)) for k, v in node.items()) if v is not NO_VALUE}


def _condition(node: Any, refs: Mapping[str, Any], known: Mapping[str, bool]) -> bool:
    """A template condition (Fn::Equals, Fn::Not, Fn::And, Fn::Or, Condition) with the parameters given."""
    ((key, value),) = node.items()
    if key == "Fn::Equals":
        left, right = (_resolve(v, refs, known, {}) for v in value)
        return bool(left == right)
    if key == "Fn::Not":
        return not _condition(value[0], refs, known)
    if key == "Fn::And":
        return all(_condition(v, refs, known) for v in value)
    if key == "Fn::Or":
        return any(_condition(v, refs, known) for v in value)
    if key == "Condition":
        return known[value]
    raise ValueError(f"condition {key} not understood")


def role_policy(parameters: Mapping[str, str], stack: str = "prod") -> list[dict[str, Any]]:
    """The instance role's statements, with the template's parameters (and defaults) filled in."""
    template, problems = decode_str(TEMPLATE.read_text())
    assert not problems, problems
    refs: dict[str, Any] = {
        name: parameters.get(name, spec.get("Default", "")) for name, spec in template["Parameters"].items()
    }
    for name, spec in template["Parameters"].items():
        if spec["Type"] == "CommaDelimitedList" and isinstance(refs[name], str):
            refs[name] = [v for v in refs[name].split(",") if v]
    refs.update({"AWS::Region": REGION, "AWS::AccountId": ACCOUNT, "AWS::Partition": "aws", "AWS::StackName": stack})
    conditions: dict[str, bool] = {}
    for name, spec in template["Conditions"].items():
        conditions[name] = _condition(spec, refs, conditions)
    resources = template["Resources"]
    attrs: dict[str, str] = {}
    for name, spec in resources.items():
        properties = spec.get("Properties", {})
        if spec["Type"] == "AWS::DynamoDB::Table":
            table = _resolve(properties["TableName"], refs, conditions, {})
            attrs[f"{name}.Arn"] = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table}"
        elif spec["Type"] == "AWS::Logs::LogGroup":
            group = _resolve(properties["LogGroupName"], refs, conditions, {})
            attrs[f"{name}.Arn"] = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}:*"
    policies = template["Resources"]["InstanceRole"]["Properties"]["Policies"]
    statements: list[dict[str, Any]] = []
    for policy in policies:
        statements.extend(_resolve(policy["PolicyDocument"]["Statement"], refs, conditions, attrs))
    return statements


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def allowed(statements: Iterable[Mapping[str, Any]], call: Call) -> bool:
    for s in statements:
        if s.get("Effect") != "Allow":
            continue
        actions = _listed(s["Action"])
        resources = _listed(s["Resource"])
        # A call naming no resource (GetRecords by shard iterator) needs the action on some resource.
        if any(fnmatch.fnmatchcase(call.action.lower(), a.lower()) for a in actions) and any(
            r == "*" or call.resource == "*" or fnmatch.fnmatchcase(call.resource, r) for r in resources
        ):
            return True
    return False


def _body(entry: Mapping[str, Any]) -> dict[str, Any]:
    raw = base64.b64decode(entry["body"]) if entry.get("body_encoded") else (entry.get("body") or "").encode()
    try:
        parsed = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def recorded_calls(recording_lines: Iterable[str]) -> set[Call]:
    """Every DynamoDB and Kinesis call in a moto request recording, with the ARN it acts on."""
    calls: set[Call] = set()
    for line in recording_lines:
        entry = json.loads(line)
        target = {k.lower(): v for k, v in entry["headers"].items()}.get("x-amz-target", "")
        prefix, _, operation = target.rpartition(".")
        body = _body(entry)
        if prefix.startswith("DynamoDB"):
            tables = list(body.get("RequestItems", {})) or [
                t
                for t in [body.get("TableName")]
                + [next(iter(a.values())).get("TableName") for a in body.get("TransactItems", [])]
                if t
            ]
            for table in tables or ["*"]:
                arn = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table}" if table != "*" else "*"
                if body.get("IndexName"):
                    arn += "/index/" + body["IndexName"]
                calls.add(Call("dynamodb:" + operation, arn))
        elif prefix.startswith("Kinesis"):
            arn = body.get("StreamARN") or (
                f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/{body['StreamName']}" if body.get("StreamName") else "*"
            )
            calls.add(Call("kinesis:" + operation, arn))
    return calls


def kcl_tables(parameters: Mapping[str, str]) -> list[dict[str, Any]]:
    """CreateTable requests for the KCL's tables as scripts/copier.yaml defines them (the role cannot create
    them: a test run creates them from these, as CloudFormation would, before the daemon starts)."""
    template, problems = decode_str(TEMPLATE.read_text())
    assert not problems, problems
    refs: dict[str, Any] = {
        name: parameters.get(name, spec.get("Default", "")) for name, spec in template["Parameters"].items()
    }
    out = []
    for name, spec in template["Resources"].items():
        if spec["Type"] != "AWS::DynamoDB::Table" or name == "StateTable":
            continue
        p = spec["Properties"]
        request: dict[str, Any] = {
            "TableName": _resolve(p["TableName"], refs, {}, {}),
            "AttributeDefinitions": p["AttributeDefinitions"],
            "KeySchema": p["KeySchema"],
            "BillingMode": p["BillingMode"],
        }
        if "GlobalSecondaryIndexes" in p:
            request["GlobalSecondaryIndexes"] = p["GlobalSecondaryIndexes"]
        out.append(request)
    return out


def kcl_kinesis_operations() -> dict[str, set[str]]:
    """Every Kinesis operation the KCL jars copier runs can call, with the classes that name its request.

    The KCL builds each call from the SDK's ``services/kinesis/model/<Operation>Request``; a class that
    calls an operation names that request class in its constant pool. Read in amazon-kinesis-client and
    amazon-kinesis-client-multilang 3.1.3: DescribeStreamConsumer, DescribeStreamSummary and
    RegisterStreamConsumer (retrieval/fanout/FanOutConsumerRegistration), SubscribeToShard
    (retrieval/fanout/FanOutRecordsPublisher), GetRecords and GetShardIterator (retrieval/polling), ListShards
    (leases/KinesisShardDetector); no ListStreamConsumers, no DeregisterStreamConsumer.
    """
    from copier.kcl.jars import jars

    found: dict[str, set[str]] = {}
    for jar in jars():
        if not jar.name.startswith("amazon-kinesis-client"):
            continue
        with zipfile.ZipFile(jar) as archive:
            for name in archive.namelist():
                if name.endswith(".class"):
                    for operation in re.findall(rb"services/kinesis/model/(\w+)Request\b", archive.read(name)):
                        found.setdefault(operation.decode(), set()).add(name.rsplit("/", 1)[-1])
    return found
