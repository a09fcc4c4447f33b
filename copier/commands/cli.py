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
from collections.abc import Callable, Sequence
from typing import Any

from copier.adapters.journal import say
from copier.core.config import Config
from copier.core.errors import ConfigError, CopierError

__all__ = ["main"]

EXIT_CONFIG = 2
EXIT_FATAL = 3


def _config(path: str) -> Config:
    from copier.adapters.localkeys import command_config  # dummy keys on the local backend when none are set

    return command_config(path)


def _start(path: str, checks: Callable[[], int]) -> int:
    """Run a start's ``checks`` (check-config, or run up to the daemon's exec): a failure is said through
    ``copier.adapters.startlog`` (once per cause under a service manager) with its exit status; a start that
    gets through clears the record of the last failure."""
    from copier.adapters.startlog import StartLog
    from copier.commands.preflight import LintFailed

    log = StartLog(path)
    try:
        status = checks()
    except LintFailed as exc:
        log.failed(exc.lines)
        return EXIT_CONFIG
    except CopierError as exc:
        log.failed([(str(exc), "error")])
        return EXIT_CONFIG if isinstance(exc, ConfigError) else EXIT_FATAL
    if status == 0:
        log.passed()
    return status


def cmd_check_config(args: argparse.Namespace) -> int:
    """Validate the file (exit 2); then, unless offline, the endpoints, the target's role, the state table
    and the streams (exit 3, or 4 for settings copier would not forward under): ``copier.commands.preflight``."""
    from copier.commands.preflight import check_config

    path = args.properties or args.file
    if path is None:
        raise SystemExit("copier check-config: give the properties file (FILE or --properties FILE)")
    return _start(path, lambda: check_config(_config(path), args.offline, args.shared))


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
    """Check what the daemon needs (``copier.commands.preflight``: one line and exit 2 or 3 if it fails),
    then exec the daemon."""
    from copier.adapters.summaryshare import SHARE_ENV, SummaryShare
    from copier.commands.preflight import check_before_run
    from copier.kcl.daemon import run_daemon

    loaded: list[Config] = []
    # The run's DescribeStreamSummary share, made before the checks so that their answers are the processors'
    # first (a fleet start then asks once per host and stream, not twice); owned by this pid, which the exec
    # keeps: the supervisor adopts it (copier.kcl.supervisor) and removes it when the daemon ends.
    run = SummaryShare.start_run()

    def checks() -> int:
        loaded.append(_config(args.properties))
        share = SummaryShare.for_host(loaded[0], {SHARE_ENV: str(run)}) if run is not None else None
        check_before_run(loaded[0], share)
        return 0

    try:
        status = _start(args.properties, checks)
        if status == 0:
            status = run_daemon(loaded[0], args.properties, run)  # returns only when the exec did not happen
    except BaseException:
        SummaryShare.end_run(run)
        raise
    SummaryShare.end_run(run)
    return status


def _processor_clients(config: Config, clock_bounds: Any, shared: bool = False) -> tuple[Any, Any]:
    """The processor's state store and streams: on the lean path (``copier.adapters.awsauth``: no botocore,
    a third of the memory) wherever it does what botocore would, else botocore's, saying why once.
    ``shared``: DescribeStreamSummary answers shared with the other processors of this daemon and the other
    hosts of the application (``copier process``: ``copier.adapters.summaryboard``); a command an operator
    runs (redrive, repair) asks for itself, so that a setting changed just before it (a limit raised to
    redrive what it refused) is what it acts on."""
    import structlog

    from copier.adapters.awsauth import endpoint_for, lean_credentials, lean_reason
    from copier.adapters.awsjson import JsonClient, usable
    from copier.adapters.kinesis import KinesisStreams
    from copier.adapters.summaryboard import ApplicationAnswers
    from copier.adapters.summaryshare import SummaryShare

    share = SummaryShare.for_host(config) if shared else None  # one answer per stream for the daemon's processors
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
        store: Any = LeanStateStore(config, client)
        board = ApplicationAnswers(config, store) if shared else None
        return store, KinesisStreams(config, clock_bounds=clock_bounds, lean=credentials, share=share, board=board)
    from copier.adapters.dynamo import DynamoStateStore

    structlog.get_logger().info("botocore_clients", reason=reason)
    store = DynamoStateStore(config, clock_bounds=clock_bounds)
    board = ApplicationAnswers(config, store) if shared else None
    return store, KinesisStreams(config, clock_bounds=clock_bounds, share=share, board=board)


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
    from copier.kcl.daemon import PROPERTIES_ENV

    path = args.properties or os.environ.get(PROPERTIES_ENV)  # copier run names its file for its processors
    if path is None:
        say(f"copier process: give --properties FILE (copier run sets {PROPERTIES_ENV} for the processors)", "error")
        return EXIT_CONFIG
    config = _config(path)

    from copier.adapters.logs import configure_logging
    from copier.adapters.metrics import emitter_for
    from copier.core.clockcheck import ClockBounds
    from copier.kcl.processor import CopierRecordProcessor, kcl_process, tune_gc
    from copier.shard import ShardWorker

    configure_logging(config.log_level)
    clock_bounds = ClockBounds()  # this host's clock against AWS, from every answer the store and streams receive
    store, streams = _processor_clients(config, clock_bounds, shared=True)

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

    p = sub.add_parser("process", help="the record processor the MultiLangDaemon spawns (executableName)")
    p.add_argument("--properties", metavar="FILE", help=f"{PROPERTIES_HELP}; default: the one copier run was given")
    p.set_defaults(func=cmd_process)

    p = sub.add_parser("init", help="create the state table if absent (idempotent)")
    p.add_argument("--properties", required=True, metavar="FILE", help=PROPERTIES_HELP)
    p.set_defaults(func=cmd_init)

    for name, module, text in (  # commands whose options and code live in a module of their own
        ("status", "commands.status", "is every shard copied: owner alive, behind, stalled (--check: exit 1 if not)"),
        ("verify", "commands.verify", "audit the target (and dead-letter) stream against what was produced"),
        ("redrive", "commands.redrive", "send dead-lettered events on to the target, exactly once (--dry-run first)"),
        ("repair", "commands.repair", "put back what copier verify reports lost in a range, then audit it again"),
        ("export", "commands.export", "a stream (or a time range of it) to JSON-lines files for copier audit"),
        ("audit", "spark.audit", "the exactly-once audit as a Spark job, over exported or Firehose files"),
        ("produce", "commands.produce", "the PySpark job writing JSON-lines files to the staging stream"),
        ("demo", "commands.demo", "the whole pipeline on the embedded local backend, with a summary"),
        ("plan", "commands.plan", "what a workload costs: hosts, DynamoDB, Kinesis, each AWS API's budget"),
    ):
        _module_command(sub.add_parser(name, help=text), f"copier.{module}", only)

    p = sub.add_parser("local-backend", help="serve local Kinesis and DynamoDB on 127.0.0.1 (for tests and demos)")
    _module_command(p, "copier.local.backend", only)

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
    p.add_argument(
        "--shared",
        action="store_true",
        help="take the streams' settings from the application's answers in the state table when at most 30 s "
        "old, and post the ones asked for (the service's ExecStartPre: a fleet start asks once per stream)",
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
