"""The state table's TTL on ``expires_at``: ``copier init`` enables it or says what is left; check-config and
``copier run`` refuse a table without it (issue 43, item 15).

Without TTL nothing fails: digest batches never expire and the table grows
for as long as copier runs. Reproduced on an endpoint that answers
UnknownOperationException to UpdateTimeToLive (a front on 127.0.0.1 before
the local backend, refusing that one call): ``copier init`` used to report
"CreateTable failed" for a table it had created, and a second ``copier
init`` exited 0 without ever enabling TTL.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from tests.conftest import Pipeline
from tests.support.serving import RefusingFront, serving
from tests.test_check_config import copier


def _front(pipeline: Pipeline, refused: set[str]) -> RefusingFront:
    return RefusingFront(urlsplit(pipeline.endpoint).netloc, refused)


def test_init_finishes_a_table_whose_ttl_the_endpoint_would_not_enable(pipeline: Pipeline) -> None:
    """UpdateTimeToLive refused: init exits 3 naming the call, its code and what is left, every time it is run
    (not 0 the second time); check-config and run refuse the table; init against an endpoint that has the call
    enables TTL, and then the checks pass."""
    table = f"{pipeline.table}-no-ttl"
    with serving(_front(pipeline, {"UpdateTimeToLive"})) as front:
        props = pipeline.write_properties(stateTableName=table, stateTableEndpoint=front.url)
        where = f"the state table {table} (region us-east-1, endpoint {front.url})"
        first = copier("init", "--properties", str(props))
        assert first.returncode == 3, first
        assert f"UpdateTimeToLive failed: UnknownOperationException: {where}: it was created, but TTL on " in (
            first.stderr
        )
        assert "expires_at is not enabled, so its digest batches would never expire" in first.stderr
        assert f"copier init --properties {props}" in first.stderr and "CreateTable" not in first.stderr
        again = copier("init", "--properties", str(props))
        assert again.returncode == 3, again
        assert f"UpdateTimeToLive failed: UnknownOperationException: {where}: it exists, but TTL" in again.stderr
        checked = copier("check-config", str(props))
        assert checked.returncode == 3, checked
        assert f"{where}: its TTL is DISABLED (DescribeTimeToLive)" in checked.stderr
        assert "the table grows without end" in checked.stderr
        assert f"copier init --properties {props}" in checked.stderr
        run = copier("run", "--properties", str(props))
        assert run.returncode == 3, run.stderr[-2000:]
        assert "its TTL is DISABLED" in run.stderr and "MultiLangDaemon" not in run.stderr + run.stdout
        assert front.seen == ["UpdateTimeToLive"] * 3, "PynamoDB's try, then init's own, then the second init's"
    direct = pipeline.write_properties(stateTableName=table)
    done = copier("init", "--properties", str(direct))
    assert done.returncode == 0, done
    assert done.stdout.strip() == f"state table {table}: already exists; TTL on expires_at: enabled now (it was off)"
    checked = copier("check-config", str(direct))
    assert checked.returncode == 0, checked
    assert f"state table {table}: exists (region us-east-1, endpoint {pipeline.endpoint}), TTL ENABLED on " in (
        checked.stdout
    )


def test_a_ttl_on_another_attribute_or_a_ttl_that_cannot_be_read_is_refused(pipeline: Pipeline) -> None:
    """TTL on another attribute: check-config and init both refuse it, saying a table has one TTL attribute;
    an endpoint without DescribeTimeToLive: check-config names that call and its code."""
    table = f"{pipeline.table}-other-ttl"
    pipeline.dynamodb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": n, "AttributeType": "S"} for n in ("pk", "sk")],
        BillingMode="PAY_PER_REQUEST",
    )
    pipeline.dynamodb.update_time_to_live(
        TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "other"}
    )
    props = pipeline.write_properties(stateTableName=table)
    for command in (("check-config", str(props)), ("init", "--properties", str(props))):
        result = copier(*command)
        assert result.returncode == 3, result
        assert "its TTL is ENABLED on the attribute other, not on expires_at" in result.stderr
        assert "a table has one TTL attribute: disable TTL on other" in result.stderr
    with serving(_front(pipeline, {"DescribeTimeToLive"})) as front:
        through = pipeline.write_properties(stateTableName=pipeline.table, stateTableEndpoint=front.url)
        result = copier("check-config", str(through))
    assert result.returncode == 3, result
    assert "DescribeTimeToLive failed: UnknownOperationException: the state table " in result.stderr
    assert "its TTL on expires_at cannot be checked" in result.stderr


def test_the_instance_role_may_read_the_ttl(tmp_path: Path) -> None:
    """copier run and check-config call DescribeTimeToLive on the host: the template's role allows it."""
    from tests.support.iam import ACCOUNT, REGION, Call, allowed, role_policy

    policy = role_policy({"ApplicationName": "app", "StagingStreamName": "s", "TargetStreamName": "t"})
    arn = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/app-copier-state"
    assert allowed(policy, Call("dynamodb:DescribeTimeToLive", arn))
    assert not allowed(policy, Call("dynamodb:UpdateTimeToLive", arn)), "the template enables it, not the role"
