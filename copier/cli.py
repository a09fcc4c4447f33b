"""The ``copier`` command line (DESIGN section 6).

Exit status: 0 success; 2 a bad properties file or bad arguments (reported
in one line before any AWS call); 3 a fatal AWS error or an unrecoverable
fault in the record processor.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from copier.config import Config, load_config
from copier.errors import ConfigError, CopierError

__all__ = ["main"]

EXIT_CONFIG = 2
EXIT_FATAL = 3


def _config(path: str) -> Config:
    return load_config(path)


def cmd_check_config(args: argparse.Namespace) -> int:
    config = _config(args.file)
    print(
        f"{config.path}: ok: {config.stream_name} -> {config.target_stream_name}, "
        f"state table {config.state_table_name}, dedupKey {config.dedup_key}, "
        f"window {config.dedup_window_events} events, lease {config.lease_millis} ms"
    )
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from copier.dynamo import DynamoStateStore
    from copier.logs import configure_logging

    config = _config(args.properties)
    configure_logging(config.log_level)
    created = DynamoStateStore(config).create_table()
    state = "created" if created else "already exists"
    print(f"state table {config.state_table_name}: {state}")
    return 0


def cmd_process(args: argparse.Namespace) -> int:
    """The record processor. stdout carries the protocol only: stray prints go to stderr."""
    protocol_out = sys.stdout
    sys.stdout = sys.stderr
    config = _config(args.properties)

    from amazon_kclpy import kcl

    from copier.dynamo import DynamoStateStore
    from copier.kinesis import KinesisStreams
    from copier.logs import configure_logging
    from copier.processor import CopierRecordProcessor
    from copier.shard import ShardWorker

    configure_logging(config.log_level)
    store = DynamoStateStore(config)
    streams = KinesisStreams(config)

    def make_worker() -> ShardWorker:
        return ShardWorker(config, store, streams)

    processor = CopierRecordProcessor(make_worker, config.checkpoint_interval_millis)
    kcl.KCLProcess(processor, input_file=sys.stdin, output_file=protocol_out, error_file=sys.stderr).run()
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="copier", description="Exactly-once Kinesis-to-Kinesis copier.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("process", help="the record processor the MultiLangDaemon spawns (executableName)")
    p.add_argument("--properties", required=True, metavar="FILE")
    p.set_defaults(func=cmd_process)

    p = sub.add_parser("init", help="create the state table if absent (idempotent)")
    p.add_argument("--properties", required=True, metavar="FILE")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("check-config", help="validate a properties file")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(func=cmd_check_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"copier: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except CopierError as exc:
        print(f"copier: {exc}", file=sys.stderr)
        return EXIT_FATAL
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
