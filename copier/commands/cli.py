"""The ``copier`` command line (DESIGN section 6).

Exit status: 0 success; 2 a bad properties file or bad arguments (reported
in one line before any AWS call); 3 a fatal AWS error or an unrecoverable
fault in the record processor.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from copier.adapters.journal import say
from copier.core.config import Config, load_config
from copier.core.errors import AwsError, ConfigError, CopierError, FatalAwsError
from copier.core.streamsettings import Verdict

__all__ = ["main"]

EXIT_CONFIG = 2
EXIT_FATAL = 3
_VERDICT_LEVELS = {"ok": "info", "warning": "warning", "error": "error"}


def _config(path: str) -> Config:
    config = load_config(path)
    _local_credentials(config)
    return config


def _local_credentials(config: Config) -> None:
    """Dummy credentials for a run whose every endpoint is on this machine (the local backend) when none are
    set, so that ``copier init`` and friends work there without exporting keys; never for AWS itself."""
    endpoints = [config.kinesis_endpoint, config.dynamodb_endpoint, config.target_endpoint, config.state_endpoint]
    local = all(e is not None and urlparse(e).hostname in ("127.0.0.1", "localhost", "::1") for e in endpoints)
    if local and not os.environ.get("AWS_ACCESS_KEY_ID") and not os.environ.get("AWS_PROFILE"):
        from copier.local.backend import DUMMY_ENV  # what the local backend's own runs sign with

        os.environ.update({k: DUMMY_ENV[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})


def _lint(config: Config, host: bool = True) -> bool:
    """The file's keys and (``host``) its executableName on this host checked (``copier.core.propertylint``),
    each finding a line on stderr; False if one is an error (the daemon would not run as the file says)."""
    from copier.core.config import COPIER_KEYS
    from copier.core.propertylint import lint_properties

    text = Path(config.path).read_text(encoding="utf-8")
    findings = lint_properties(text, config.path, list(COPIER_KEYS), host=host)
    for f in findings:
        say(f"{f.level}: {config.path}:{f.line}: {f.key}: {f.text}", f.level)
    return not any(f.level == "error" for f in findings)


def cmd_check_config(args: argparse.Namespace) -> int:
    """Validate the file (exit 2); with a target role, also assume it and describe the target (exit 3)."""
    path = args.properties or args.file
    if path is None:
        raise SystemExit("copier check-config: give the properties file (FILE or --properties FILE)")
    config = _config(path)
    if not _lint(config, host=not args.offline):  # offline: the file alone (it may be meant for another host)
        return EXIT_CONFIG
    print(
        f"{config.path}: ok: {config.stream_name} -> {config.target_stream_name}, "
        f"state table {config.state_table_name}, dedupKey {config.dedup_key}, "
        f"window {config.dedup_window_seconds} s (at most {config.dedup_window_max_events} IDs), "
        f"lease {config.lease_millis} ms, ordering {config.ordering}"
    )
    from copier.kcl.daemon import daemon_warnings

    for warning in daemon_warnings(config):
        say(f"warning: {warning}", "warning")
    if args.offline:
        return 0
    if config.target_role_arn is not None:
        from copier.adapters.target import check_target

        print(f"{config.path}: {check_target(config)}")
    _check_state_table(config)
    verdicts = stream_verdicts(config)
    for verdict in verdicts:
        out = sys.stdout if verdict.level == "ok" else sys.stderr
        prefix = "" if verdict.level == "ok" else f"{verdict.level}: "
        out.write(f"{config.path}: {prefix}{verdict.text}\n")
    return 4 if any(v.level == "error" for v in verdicts) else 0


def _check_state_table(config: Config, quiet: bool = False) -> None:
    """The state table exists (DescribeTable) with TTL on ``expires_at`` (DescribeTimeToLive); a FatalAwsError
    that names it and ``copier init`` if it does not exist, a StateTableError saying what to do if its TTL is
    off, an AwsError naming the call that failed (``quiet``: nothing said when all is well)."""
    import boto3
    import botocore.exceptions

    from copier.adapters.aws import convert_aws_error, naming_the_resource, place
    from copier.adapters.statettl import check_ttl

    client = boto3.session.Session().client("dynamodb", region_name=config.region, endpoint_url=config.state_endpoint)
    where = place(config.region, config.state_endpoint)
    try:
        client.describe_table(TableName=config.state_table_name)
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        error = convert_aws_error("DescribeTable", exc)
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


def stream_verdicts(config: Config) -> list[Verdict]:
    """DescribeStreamSummary of the staging, target and dead-letter streams, judged (copier.core.streamsettings);
    an AwsError (a stream missing, access denied, the endpoint unreachable) goes up."""
    from copier.adapters.kinesis import KinesisStreams
    from copier.commands.startcheck import start_verdicts
    from copier.core.streamsettings import judge

    streams = KinesisStreams(config)
    dlq = config.dead_letter_stream_name
    staging = streams.describe(config.stream_name)
    return judge(
        staging,
        streams.describe(config.target_stream_name),
        streams.describe(dlq) if dlq else None,
        ordering=config.ordering,
        window_ms=config.dedup_window_ms,
        digest_ttl_floor_ms=config.digest_ttl_hours * 3_600_000,
    ) + start_verdicts(config, streams, staging)  # a start at a point in time: what it means (none without one)


def cmd_init(args: argparse.Namespace) -> int:
    """Create the state table if absent and make sure its TTL is on ``expires_at``: 0 once both hold, 3 with a
    line naming the call that failed and what is left otherwise (run it again once that is fixed)."""
    from copier.adapters.dynamo import DynamoStateStore
    from copier.adapters.logs import configure_logging

    config = _config(args.properties)
    configure_logging(config.log_level)
    created, ttl = DynamoStateStore(config).create_table()  # a TTL it could not enable raises: exit 3
    print(f"state table {config.state_table_name}: {'created' if created else 'already exists'}; {ttl}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Exec the daemon; a target reached through a role is checked first (one line and exit 3 if it fails)."""
    from copier.kcl.daemon import run_daemon

    config = _config(args.properties)
    if not _lint(config):  # the daemon would start, then fail a minute in, or run with what was not meant
        return EXIT_CONFIG
    if config.target_role_arn is not None:
        from copier.adapters.target import check_target

        say(check_target(config))
    try:
        _check_state_table(config, quiet=True)
        for verdict in stream_verdicts(config):  # what the processors will act on, said once at the start
            head = "" if verdict.level == "ok" else f"{verdict.level}: "
            say(f"{head}{verdict.text}", _VERDICT_LEVELS[verdict.level])
    except FatalAwsError:
        raise  # a table or stream missing, access denied: the daemon would retry it for minutes, then stop
    # (a state table whose TTL is off raises StateTableError, not an AwsError: exit 3 as well)
    except AwsError as exc:  # the backend unreachable for now: the daemon retries, and copier run says if it gives up
        say(f"warning: the state table and streams could not be checked: {exc}", "warning")
    return run_daemon(config, args.properties)


def cmd_status(args: argparse.Namespace) -> int:
    """The status table; an AWS refusal for this host's clock is said as such, with the offset measured from
    the Date of AWS's answers (the processors on this host meet the same refusal and stall on it)."""
    from copier.core.clockcheck import ClockBounds, naming_the_clock

    bounds = ClockBounds()
    try:
        return _status(args, bounds)
    except AwsError as exc:
        named = naming_the_clock(exc, bounds.snapshot())
        if named is exc:
            raise
        raise named from exc


def _status(args: argparse.Namespace, bounds: Any) -> int:
    import time

    from copier.adapters.dynamo import DynamoStateStore
    from copier.adapters.kinesis import KinesisStreams
    from copier.commands.sourcestatus import source_lines
    from copier.commands.status import owner_gone, render, rows
    from copier.core.state import shard_key

    config = _config(args.properties)
    store = DynamoStateStore(config, clock_bounds=bounds)
    streams = KinesisStreams(config, clock_bounds=bounds)
    shards = streams.shards(config.stream_name)
    keys = {shard_key(config.stream_name, s["ShardId"]): s["ShardId"] for s in shards}
    states = {keys[key]: state for key, state in store.get_many(keys).items()}
    now = time.time_ns() // 1_000_000
    unverified = {
        shard_id
        for shard_id, state in states.items()
        if owner_gone(state, now) and store.get_batch(shard_key(config.stream_name, shard_id), state.batches + 1)
    }
    print(render(rows(shards, states, now, unverified, config.start_ms), as_json=args.json))
    for line in source_lines(config, store, streams, keys.values(), now, args.json):  # redrives and repairs
        print(line)
    if not args.json:  # what the processors work under: the streams' distribution strategies and record limits
        names = [config.stream_name, config.target_stream_name, config.dead_letter_stream_name]
        for name in filter(None, names):
            found = streams.settings(name)
            if found is None:
                print(f"{name}: settings cannot be read")
            else:
                print(
                    f"{name}: RecordDistributionStrategy {found.distribution}, "
                    f"MaxRecordSize {found.max_record_bytes // 1024} KiB"
                )
    return 0


def _processor_clients(config: Config, clock_bounds: Any) -> tuple[Any, Any]:
    """The processor's state store and streams: on the lean path (``copier.adapters.awsauth``: no botocore,
    a third of the memory) wherever it does what botocore would, else botocore's, saying why once."""
    import structlog

    from copier.adapters.awsauth import endpoint_for, lean_credentials, lean_reason
    from copier.adapters.awsjson import JsonClient, usable
    from copier.adapters.kinesis import KinesisStreams

    calls = [
        ("kinesis", config.region, config.kinesis_endpoint),
        ("kinesis", config.target_region, config.target_endpoint),
        ("dynamodb", config.region, config.state_endpoint),
    ]
    reason = lean_reason(calls, config.target_role_arn, proxied=lambda url: not usable(url))
    if reason is None:
        from copier.adapters.leanstate import LeanStateStore

        credentials = lean_credentials()
        url = config.state_endpoint or endpoint_for("dynamodb", config.region)
        assert url is not None  # lean_reason checked it
        client = JsonClient("dynamodb", config.region, url, credentials, 5.0, 10.0, clock_bounds.observe)
        return LeanStateStore(config, client), KinesisStreams(config, clock_bounds=clock_bounds, lean=credentials)
    from copier.adapters.dynamo import DynamoStateStore

    structlog.get_logger().info("botocore_clients", reason=reason)
    store = DynamoStateStore(config, clock_bounds=clock_bounds)
    return store, KinesisStreams(config, clock_bounds=clock_bounds)


def cmd_process(args: argparse.Namespace) -> int:
    """The record processor. stdout carries the protocol only: stray prints go to stderr.

    SIGTERM and SIGINT are ignored: the daemon alone ends a processor's life
    (shutdown_requested: finish the batch, checkpoint, release; then the end of
    its input). A signal sent to the whole process group (systemd's
    KillMode=control-group, Ctrl-C in a terminal) would otherwise kill every
    processor before the daemon asks it to release its shard, and each
    successor would sleep out a lease. An orphan (daemon SIGKILLed) still ends:
    its input closes.
    """
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    protocol_out = sys.stdout
    sys.stdout = sys.stderr
    config = _config(args.properties)

    from copier.adapters.logs import configure_logging
    from copier.adapters.metrics import emitter_for
    from copier.core.clockcheck import ClockBounds
    from copier.kcl.processor import CopierRecordProcessor, kcl_process, tune_gc
    from copier.shard import ShardWorker

    configure_logging(config.log_level)
    clock_bounds = ClockBounds()  # this host's clock against AWS, from every answer the store and streams receive
    store, streams = _processor_clients(config, clock_bounds)

    emitter = emitter_for(config)

    def make_worker() -> ShardWorker:
        return ShardWorker(config, store, streams, metrics=emitter, clock_bounds=clock_bounds)

    processor = CopierRecordProcessor(make_worker, config.checkpoint_interval_millis)
    tune_gc()
    if isinstance(sys.stdin, io.TextIOWrapper):
        # The daemon writes UTF-8 (copier run starts it with -Dfile.encoding=UTF-8): read UTF-8 whatever this
        # host's locale, and a byte that is not UTF-8 as a lone surrogate in its key (refused per record,
        # copier.core.limits), never an error that would end the process and every shard on the host.
        sys.stdin.reconfigure(encoding="utf-8", errors="surrogateescape")
    kcl_process(processor, sys.stdin, protocol_out, sys.stderr).run()
    processor.input_closed()
    return 0


def _local_backend(argv: list[str]) -> int:
    from copier.local.backend import main as backend_main

    return backend_main(argv)


PROPERTIES_HELP = "the properties file the daemon and copier share (properties/copier.properties documents it)"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("copier")
    except PackageNotFoundError:  # run from a source tree that was not installed
        return "(not installed)"


def _module_command(p: argparse.ArgumentParser, module: str, only: str | None) -> None:
    """A command whose options and code live in ``module``, imported only when this command (``only``) is
    the one run, or every command is wanted (``only`` None: help, completion): a record processor imports
    no Spark job, no export, no demo."""
    if only is not None and only != p.prog.rpartition(" ")[2]:
        return
    import importlib

    code = importlib.import_module(module)
    code.add_arguments(p)
    p.set_defaults(func=code.main)


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; ``only``: the command about to run (others are listed, their modules not loaded)."""
    parser = argparse.ArgumentParser(prog="copier", description="Exactly-once Kinesis-to-Kinesis copier.")
    parser.add_argument("--version", action="version", version=f"copier {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run the KCL MultiLangDaemon with FILE (the service's ExecStart)")
    p.add_argument("--properties", required=True, metavar="FILE", help=PROPERTIES_HELP)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("status", help="per-shard owner, epoch, position, lag and counters")
    p.add_argument("--properties", required=True, metavar="FILE", help=PROPERTIES_HELP)
    p.add_argument("--json", action="store_true", help="one JSON object per shard")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("process", help="the record processor the MultiLangDaemon spawns (executableName)")
    p.add_argument("--properties", required=True, metavar="FILE", help=PROPERTIES_HELP)
    p.set_defaults(func=cmd_process)

    p = sub.add_parser("init", help="create the state table if absent (idempotent)")
    p.add_argument("--properties", required=True, metavar="FILE", help=PROPERTIES_HELP)
    p.set_defaults(func=cmd_init)

    for name, module, text in (  # commands whose options and code live in a module of their own
        ("verify", "commands.verify", "audit the target (and dead-letter) stream against what was produced"),
        ("redrive", "commands.redrive", "send dead-lettered events on to the target, exactly once (--dry-run first)"),
        ("repair", "commands.repair", "put back what copier verify reports lost in a range, then audit it again"),
        ("export", "commands.export", "a stream (or a time range of it) to JSON-lines files for copier audit"),
        ("audit", "spark.audit", "the exactly-once audit as a Spark job, over exported or Firehose files"),
        ("produce", "commands.produce", "the PySpark job writing JSON-lines files to the staging stream"),
        ("demo", "commands.demo", "the whole pipeline on the embedded local backend, with a summary"),
    ):
        _module_command(sub.add_parser(name, help=text), f"copier.{module}", only)

    p = sub.add_parser("local-backend", help="serve local Kinesis and DynamoDB on 127.0.0.1 (for tests and demos)")
    p.add_argument("--port", type=int, default=4566)
    p.set_defaults(func=lambda a: _local_backend(["--port", str(a.port)]))

    p = sub.add_parser("scale-in-watch", help="on Auto Scaling scale-in, stop copier.service, then let it go on")
    _module_command(p, "copier.commands.scalein", only)

    p = sub.add_parser("configure", help="write the properties file from a deployment's parameters (no shell)")
    _module_command(p, "copier.commands.configure", only)

    p = sub.add_parser(
        "check-config",
        help="validate a properties file, then the streams' settings (exit 4 if copier would not forward under them)",
    )
    p.add_argument("file", metavar="FILE", nargs="?", help="the properties file (or --properties FILE)")
    p.add_argument("--properties", metavar="FILE", help="the properties file (as every other command takes it)")
    p.add_argument(
        "--offline",
        action="store_true",
        help="only the file: not this host's executableName, nor AWS (copier.targetRoleArn, the state table, "
        "the streams)",
    )
    p.set_defaults(func=cmd_check_config)

    p = sub.add_parser("help", help="a command's options, or a topic: exit-codes, logs, properties")
    p.add_argument("name", metavar="COMMAND|TOPIC", nargs="?", help="a command, or exit-codes, logs, properties")
    p.set_defaults(func=lambda a: _help(parser, a.name))

    p = sub.add_parser("completion", help="print a shell completion script (bash)")
    p.add_argument("shell", choices=["bash"], help="the shell (bash; zsh loads it with bashcompinit)")
    p.set_defaults(func=lambda a: _completion(parser))
    return parser


def _help(parser: argparse.ArgumentParser, name: str | None) -> int:
    from copier.commands.helptopics import help_text

    text, known = help_text(parser, name)
    (sys.stdout if known else sys.stderr).write(text)
    return 0 if known else EXIT_CONFIG


def _completion(parser: argparse.ArgumentParser) -> int:
    from copier.commands.helptopics import bash_completion

    sys.stdout.write(bash_completion(parser))
    return 0


# Options whose value may start with "-" (a relative time, "-2h"), which argparse would take for an option.
DASH_VALUES = ("--since", "--until")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line parsed, ``--since -2h`` read as ``--since=-2h``."""
    words = list(sys.argv[1:] if argv is None else argv)
    glued: list[str] = []
    for word in words:
        if glued and glued[-1] in DASH_VALUES and word.startswith("-") and not word.startswith("--"):
            glued[-1] = f"{glued[-1]}={word}"
        else:
            glued.append(word)
    command = next((w for w in glued if not w.startswith("-")), None)
    light = command not in (None, "help", "completion")
    return _parser(command if light else None).parse_args(glued)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        say(str(exc), "error")
        return EXIT_CONFIG
    except CopierError as exc:
        say(str(exc), "error")
        return EXIT_FATAL
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
