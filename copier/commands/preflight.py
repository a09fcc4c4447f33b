"""What ``copier check-config`` and ``copier run`` check before the KCL daemon starts, in this order:

1. the file: its keys, the values of the keys only the daemon reads (``copier.core.kclkeys``), its regions
   against AWS's partitions, and (on this host) its ``executableName`` (``copier.core.propertylint``);
2. that every endpoint the start needs answers a connection at all (``copier.adapters.reach``): a backend
   that is down, a region whose endpoint does not resolve, a firewall, each said in one line within seconds
   (``copier.core.startfaults``) instead of the daemon's two minutes of retries and stack traces;
3. the target through its role, if one is configured; the state table and its TTL; the streams' settings
   and what a start at a point in time means (``copier.core.streamsettings``, ``copier.commands.startcheck``).

A failure at 1 is exit 2, at 2 or 3 exit 3 (``copier help exit-codes``); what fails is said through
``copier.adapters.startlog``, so a service manager restarting copier on the same cause hears it once.
check-config says ``ok`` last, once everything it checked passed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from copier.adapters.journal import say
from copier.core.config import COPIER_KEYS, Config
from copier.core.errors import AwsError, ConfigError, EndpointUnreachable, FatalAwsError
from copier.core.streamsettings import Verdict

if TYPE_CHECKING:
    from copier.adapters.summaryshare import SummaryShare

__all__ = [
    "LintFailed",
    "check_before_run",
    "check_config",
    "check_reachable",
    "check_state_table",
    "describe_retrieval",
    "lint",
    "stream_verdicts",
]

EXIT_CONFIG = 2
_VERDICT_LEVELS = {"ok": "info", "warning": "warning", "error": "error"}


def lint(config: Config, host: bool = True) -> list[tuple[str, str]]:
    """What is wrong with the file beyond copier's own values, as (line, level): its keys, the daemon's values,
    its regions and (``host``) its executableName on this host."""
    from copier.adapters.awsauth import endpoint_for
    from copier.core.properties import parse_properties
    from copier.core.propertylint import lint_properties
    from copier.kcl.daemon import processor_which

    text = Path(config.path).read_text(encoding="utf-8")
    which = processor_which(os.environ)  # as the daemon copier run starts will look for the processor
    findings = lint_properties(text, config.path, list(COPIER_KEYS), host=host, which=which)
    found = [(f.level, f.line, f.key, f.text) for f in findings]
    lines = {key: line for key, (line, _) in parse_properties(text).items()}
    for key, region in (("regionName", config.region), ("copier.targetRegionName", config.target_region)):
        if key in lines and endpoint_for("kinesis", region) is None:  # botocore would refuse it as well
            found.append(
                (
                    "error",
                    lines[key],
                    key,
                    f"{region} is in none of AWS's partitions (regions look like "
                    "us-east-1, eu-west-2, cn-north-1, us-gov-west-1: botocore's partitions.json)",
                )
            )
    # an error in the form of copier's own (a ConfigError: ``path:line: key: problem``), a warning so marked
    return [
        (f"{'' if level == 'error' else f'{level}: '}{config.path}:{line}: {key}: {text}", level)
        for level, line, key, text in found
    ]


def _endpoints(config: Config) -> dict[str, tuple[list[str], str, list[str]]]:
    """Every endpoint the start calls: URL -> (what is called there, the region, the keys naming it)."""
    from copier.adapters.awsauth import endpoint_for

    calls = [
        ("Kinesis", config.region, config.kinesis_endpoint, "kinesisEndpoint"),
        ("DynamoDB", config.region, config.dynamodb_endpoint, "dynamoDBEndpoint"),
        ("Kinesis", config.target_region, config.target_endpoint, "copier.targetEndpoint"),
        ("DynamoDB", config.region, config.state_endpoint, "copier.stateTableEndpoint"),
    ]
    out: dict[str, tuple[list[str], str, list[str]]] = {}
    for what, region, endpoint, key in calls:
        if key == "copier.targetEndpoint" and endpoint == config.kinesis_endpoint:
            key = "kinesisEndpoint"  # the default: the staging stream's
        if key == "copier.stateTableEndpoint" and endpoint == config.dynamodb_endpoint:
            key = "dynamoDBEndpoint"
        url = endpoint or endpoint_for(what.lower(), region)
        if url is None:
            continue  # a region in no partition: the lint said so
        services, _, keys = out.setdefault(url, ([], region, []))
        if what not in services:
            services.append(what)
        if endpoint and key not in keys:
            keys.append(key)
    return out


def check_reachable(config: Config) -> None:
    """EndpointUnreachable, naming the first endpoint the start needs that does not answer a connection."""
    from copier.adapters.awsauth import listed_regions
    from copier.adapters.reach import unreached
    from copier.core.startfaults import region_note, unreachable_text

    endpoints = _endpoints(config)
    for miss in unreached(list(endpoints)):
        services, region, keys = endpoints[miss.url]
        source = f"{' and '.join(keys)} in {config.path}" if keys else "AWS's endpoint for the region"
        note = region_note(region, listed_regions()) if not keys else None
        what = " and ".join(services)
        raise EndpointUnreachable(unreachable_text(what, miss.url, region, source, miss.kind, miss.detail, note))


def _nothing_here(config: Config, error: AwsError) -> AwsError:
    """The state table is missing; if the staging stream is missing as well, the region (or the account) is the
    likelier mistake than a table nobody created: said so, instead of "create it with copier init"."""
    from copier.adapters.awsauth import listed_regions
    from copier.adapters.awserrors import place
    from copier.adapters.kinesis import KinesisStreams
    from copier.adapters.localkeys import on_this_machine
    from copier.core.startfaults import region_note

    try:
        KinesisStreams(config).describe(config.stream_name)
    except FatalAwsError as exc:
        if exc.code != "ResourceNotFoundException":
            return error
        where = place(config.region, config.state_endpoint)
        note = region_note(config.region, listed_regions())
        # a local backend has one account, whatever the keys (copier signs with dummy ones there)
        account = "" if on_this_machine(config) else " Or are the credentials another account's?"
        return FatalAwsError(
            error.operation,
            error.code,
            f"neither the staging stream {config.stream_name} nor the state table {config.state_table_name} "
            f"exists ({where}): is regionName right?{'' if note is None else f' {note}'}{account}",
        )
    except AwsError:
        return error
    return error


def check_state_table(config: Config, quiet: bool = False) -> None:
    """The state table exists (DescribeTable) with TTL on ``expires_at`` (DescribeTimeToLive); a FatalAwsError
    that names it and ``copier init`` if it does not exist (the region, if the staging stream is not there
    either), a StateTableError saying what to do if its TTL is off, an AwsError naming the call that failed
    (``quiet``: nothing said when all is well)."""
    import boto3
    import botocore.config
    import botocore.exceptions

    from copier.adapters.aws import convert_aws_error, naming_the_resource, place
    from copier.adapters.statettl import check_ttl

    retries: dict[str, object] = {"mode": "standard", "max_attempts": 2}
    bounded = botocore.config.Config(connect_timeout=3, read_timeout=10, retries=retries)  # type: ignore[arg-type]
    client = boto3.session.Session().client(
        "dynamodb", region_name=config.region, endpoint_url=config.state_endpoint, config=bounded
    )
    where = place(config.region, config.state_endpoint)
    try:
        client.describe_table(TableName=config.state_table_name)
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        error = convert_aws_error("DescribeTable", exc)
        if error.code == "ResourceNotFoundException":
            named = _nothing_here(config, error)
            if named is not error:
                raise named from exc
        what = f"the state table {config.state_table_name}"
        raise naming_the_resource(
            error, what, where, f"create it with `copier init --properties {config.path}`"
        ) from exc
    ttl = check_ttl(client, config)
    if not quiet:
        print(
            f"{config.path}: state table {config.state_table_name}: exists ({where}), "
            f"TTL {ttl.status} on {ttl.attribute}"
        )


def stream_verdicts(config: Config, share: SummaryShare | None = None, application: bool = False) -> list[Verdict]:
    """DescribeStreamSummary of the staging, target and dead-letter streams, judged (copier.core.streamsettings);
    an AwsError (a stream missing, access denied, the endpoint unreachable) goes up. ``share``: the daemon
    run's, where the answers are kept as its processors' first (``StreamSummaries.starting``), taken from the
    application's answers in the state table when one is at most ``SUMMARY_RETRY_S`` old, or posted there
    (``copier.adapters.summaryboard``: a fleet start asks once per stream); ``application``: that too, without
    a share (``check-config --shared``, the service's ``ExecStartPre``)."""
    from copier.adapters.kinesis import KinesisStreams
    from copier.commands.startcheck import start_verdicts
    from copier.core.streamsettings import judge

    board = None
    if share is not None or application:
        from copier.adapters.dynamo import DynamoStateStore
        from copier.adapters.summaryboard import ApplicationAnswers

        board = ApplicationAnswers(config, DynamoStateStore(config))
    streams = KinesisStreams(config, share=share, board=board)
    dlq = config.dead_letter_stream_name
    staging = streams.summaries.starting(config.stream_name)
    return judge(
        staging,
        streams.summaries.starting(config.target_stream_name),
        streams.summaries.starting(dlq) if dlq else None,
        ordering=config.ordering,
        window_ms=config.dedup_window_ms,
        digest_ttl_floor_ms=config.digest_ttl_hours * 3_600_000,
    ) + start_verdicts(config, streams, staging)  # a start at a point in time: what it means (none without one)


def _file_warnings(config: Config, lines: list[tuple[str, str]]) -> None:
    from copier.core.configwarnings import config_warnings
    from copier.kcl.daemon import daemon_warnings

    for text, level in lines:
        say(text, level)
    for warning in config_warnings(config, _key_lines(config.path)) + daemon_warnings(config):
        say(f"warning: {warning}", "warning")


def _key_lines(path: str) -> dict[str, int]:
    """Each key's line in the file (the last time it is given, the one that counts); none if it is unreadable."""
    from copier.core.properties import parse_properties

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return {}
    return {key: number for key, (number, _) in parse_properties(text).items()}


def check_config(config: Config, offline: bool, shared: bool = False) -> int:
    """check-config's checks in order (see the module docstring); the lint's errors raise ConfigError (the
    first) after every finding was said, so that the caller says the failure once. ``shared``: the streams'
    settings from the application's answers when at most ``SUMMARY_RETRY_S`` old (``stream_verdicts``)."""
    findings = lint(config, host=not offline)  # offline: the file alone (it may be meant for another host)
    errors = [line for line in findings if line[1] == "error"]
    if errors:
        raise LintFailed(findings)
    _file_warnings(config, findings)
    if not offline:
        check_reachable(config)
        try:
            if config.target_role_arn is not None:
                from copier.adapters.target import check_target

                print(f"{config.path}: {check_target(config)}")
            check_state_table(config)
            verdicts = stream_verdicts(config, application=shared)
        except FatalAwsError:
            raise
        except AwsError as exc:  # throttled (the account's 20 DescribeStreamSummary a second) or a 5xx: passing
            sys.stderr.write(f"{config.path}: warning: {_UNCHECKED}: {exc}\n")
            print(f"{config.path}: {describe_retrieval(config)}")
            return 0  # the service's ExecStartPre: a passing fault must not hold the host's start (no ok line)
        for verdict in verdicts:
            out = sys.stdout if verdict.level == "ok" else sys.stderr
            prefix = "" if verdict.level == "ok" else f"{verdict.level}: "
            out.write(f"{config.path}: {prefix}{verdict.text}\n")
        if any(v.level == "error" for v in verdicts):
            return 4
    print(f"{config.path}: {describe_retrieval(config)}")
    print(
        f"{config.path}: ok: {config.stream_name} -> {config.target_stream_name}, "
        f"state table {config.state_table_name}, dedupKey {config.dedup_key}, "
        f"window {config.dedup_window_seconds} s (at most {config.dedup_window_max_events} IDs), "
        f"lease {config.lease_millis} ms, ordering {config.ordering}"
    )
    return 0


def describe_retrieval(config: Config) -> str:
    """What the file's retrieval mode means for this application (``copier.core.retrieval``)."""
    from copier.core.retrieval import retrieval_summary

    return retrieval_summary(config.retrieval_mode, config.stream_name, config.consumer_name, config.retrieval_explicit)


_UNCHECKED = (
    "the state table and streams could not be checked (a passing fault: the processors read the streams' "
    "settings as they forward, and the daemon retries the table)"
)


def check_before_run(config: Config, share: SummaryShare | None = None) -> None:
    """``copier run``'s checks before the daemon starts: what would make it fail a minute in raises (a bad
    file, an endpoint that does not answer, a missing table or stream, access denied: the daemon would retry
    for minutes, then stop); a passing fault of the backend (a throttle, a 5xx) is said and the daemon goes on.
    ``share``: the run's DescribeStreamSummary share, seeded with the streams' answers (``stream_verdicts``)."""
    findings = lint(config)  # the daemon would start, then fail a minute in, or run with what was not meant
    if any(level == "error" for _, level in findings):
        raise LintFailed(findings)
    for text, level in findings:
        say(text, level)
    check_reachable(config)
    try:
        if config.target_role_arn is not None:
            from copier.adapters.target import check_target

            say(check_target(config))
        check_state_table(config, quiet=True)
        for verdict in stream_verdicts(config, share):  # what the processors will act on, said once at the start
            head = "" if verdict.level == "ok" else f"{verdict.level}: "
            say(f"{head}{verdict.text}", _VERDICT_LEVELS[verdict.level])
    except FatalAwsError:
        raise
    # (a state table whose TTL is off raises StateTableError, not an AwsError: exit 3 as well)
    except AwsError as exc:  # a passing fault of a backend that answers: the daemon retries it
        say(f"warning: {_UNCHECKED}: {exc}", "warning")
    say(describe_retrieval(config))  # once the start goes on: a failing start stays one line


class LintFailed(ConfigError):
    """The file's findings, at least one an error: each is a line of its own (``lines``)."""

    def __init__(self, lines: list[tuple[str, str]]) -> None:
        self.lines = lines
        first = next(text for text, level in lines if level == "error")
        super().__init__("-", "-", first)
