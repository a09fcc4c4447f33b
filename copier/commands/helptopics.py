"""``copier help [COMMAND|TOPIC]`` and ``copier completion bash``: the reference a terminal user reaches for.

The topics are the facts an operator needs at 3 a.m. and would otherwise dig
out of the docs: what each exit status means, every ``copier.*`` key with
its default, what the journal holds and how to filter it. The completion
script is generated from the command line parser itself, so it can never
offer a flag that does not exist.
"""

from __future__ import annotations

import argparse
import difflib

from copier.core.config import DEFAULTS

__all__ = ["TOPICS", "bash_completion", "help_text"]

EXIT_CODES = """\
Exit statuses (every command):
  0  done (copier run: a stop that was asked for: SIGTERM, SIGINT, SIGHUP)
  1  copier verify / copier audit: events lost, duplicated beyond the copier's reports, changed, or staging
     records that cannot be counted (events still to be copied are reported as PENDING and are not a failure)
     copier run: the daemon stopped on its own (it exits 0 when it gives up, e.g. "Unable to initialize
     after 20 attempts"): the last line of its log says why
     copier redrive: some selected dead-letter records could not be sent (they fail again, or staging no longer
     holds an envelope's bytes: listed, left in the dead-letter stream), or another run took a shard over
     copier repair: events of the range are still lost after it (waiting: listed with why), the audit after it
     finds copies no report explains, or another run took a shard over
     copier status --check: a problem, one line each: a stalled shard, a shard without a live owner for
     --max-unowned, one behind by more than --max-lag, a shard or a KCL table that cannot be read
  2  a bad properties file or bad arguments: one line names the file, line, key and problem; no AWS call made
  3  a fatal AWS error (a missing table or stream, denied access, a KMS key it may not use), or a state table
     whose TTL is not on expires_at (check-config, run; copier init when it cannot enable it): the line names
     the resource, the region or endpoint, the call that failed and its error code, and what to do
     check-config, run: an endpoint the start needs does not answer a connection (the backend is down, the
     region's endpoint does not resolve, a firewall): one line naming the endpoint and region, within seconds
  4  copier check-config: copier would not forward under the streams' settings (the line says which)
     copier redrive: it would not send under them (the dead-letter stream or target ignoring partition keys),
     or the target's settings cannot be read now (its record limit is not guessed): run it again
  128+N  copier run: the daemon was killed by signal N (137: SIGKILL, e.g. the kernel's OOM killer)
  130  copier redrive, copier repair: interrupted (Ctrl-C, SIGTERM) after the chunk in flight: run it again
"""

LOGS = """\
Where copier logs: stderr only (stdout of `copier process` is the daemon's protocol channel), one JSON line
per event worth a person's time, bound to the shard and epoch; the daemon's own log at copier.daemonLogLevel
(WARN by default). Under systemd every line carries its syslog priority, so

  journalctl -u copier -p warning        shows only what needs attention
  journalctl -u copier -o cat | grep '"event": "progress"'   each shard's progress line

Lines worth knowing: took_over (a shard changed hands; how: new, released, expired, waited) / released,
progress (every copier.progressIntervalSeconds: forwarded, dropped as duplicates or replays, dead-lettered, behind),
possible_duplicates (a resend that may be a copy: the event IDs, and the content digests of records without
one, that may be in the target twice; keep them: copier verify --reports excuses exactly those copies),
shard_stalled (AWS rejects one shard's request: that shard waits, the others go on; copier status shows it),
clock_margin_widened (hosts' clocks may disagree more than copier.clockSkewMillis; its cause: skew or round_trip),
fatal (the processor exits: see the line), prestart_reading / prestart_progress / prestart_loaded (an
application started at a point in time reads, at a shard's first takeover, the IDs of what arrived in the window
before its start).
"""


def _properties() -> str:
    width = max(len(key) for key in DEFAULTS)
    lines = ["Every copier.* key and its default (properties/copier.properties says what each does):"]
    shown = {None: "(required)", "": "(unset: derived from other keys or off)"}
    lines += [f"  {key:<{width}}  {shown.get(value, value)}" for key, value in DEFAULTS.items()]
    lines.append("Any other key belongs to the KCL MultiLangDaemon; `copier check-config FILE` checks them all.")
    return "\n".join(lines) + "\n"


TOPICS = {"exit-codes": lambda: EXIT_CODES, "logs": lambda: LOGS, "properties": _properties}


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subparsers only there
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def help_text(parser: argparse.ArgumentParser, name: str | None) -> tuple[str, bool]:
    """The help for ``name`` (a command or a topic; None: the overview), and whether ``name`` was known."""
    commands = _commands(parser)
    if name is None:
        overview = parser.format_help()
        topics = ", ".join(TOPICS)
        return f"{overview}\ncopier help COMMAND shows a command's options; copier help TOPIC one of: {topics}\n", True
    if name in commands:
        return commands[name].format_help(), True
    if name in TOPICS:
        return TOPICS[name](), True
    known = [*commands, *TOPICS]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"copier help: no command or topic {name!r}{hint}; known: {', '.join(known)}\n", False


def _takes_a_path(action: argparse.Action) -> bool:
    return action.nargs != 0 and (action.metavar or "") in ("FILE", "DIR", "PATH", "IDS")


def bash_completion(parser: argparse.ArgumentParser) -> str:
    """A bash completion script for every command, its options, and files where an option takes a path."""
    commands = _commands(parser)
    path_options: set[str] = set()
    cases = []
    for name, sub in commands.items():
        options = sorted(o for a in sub._actions for o in a.option_strings)
        options += sorted(str(c) for a in sub._actions if not a.option_strings and a.choices for c in a.choices)
        path_options.update(o for a in sub._actions if _takes_a_path(a) for o in a.option_strings)
        words = options + (sorted([*commands, *TOPICS]) if name == "help" else [])
        cases.append(f'        {name}) words="{" ".join(words)}" ;;')
    return "\n".join(
        [
            "# bash completion for copier: source it, or install it as /etc/bash_completion.d/copier",
            "# (made by `copier completion bash`)",
            "_copier() {",
            '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" words',
            '    if [ "$COMP_CWORD" -eq 1 ]; then',
            f'        COMPREPLY=($(compgen -W "{" ".join(commands)} --help --version" -- "$cur"))',
            "        return",
            "    fi",
            '    case "$prev" in',
            f'        {"|".join(sorted(path_options))}) COMPREPLY=($(compgen -f -- "$cur")); return ;;',
            "    esac",
            '    case "${COMP_WORDS[1]}" in',
            *cases,
            '        *) words="" ;;',
            "    esac",
            '    COMPREPLY=($(compgen -W "$words" -- "$cur"))',
            "}",
            "complete -o default -F _copier copier",
            "",
        ]
    )
