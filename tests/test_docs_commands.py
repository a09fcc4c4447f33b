"""Every command the README and docs/ show exists and takes the flags shown; the examples with output behave as
shown; ``copier help`` and the bash completion cover every command (issue 23, "Done means").

The examples are read from the Markdown itself (inline code and code blocks), so a renamed flag or command
fails here before a user finds it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from copier.commands.cli import parse
from tests.support.backend import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COPIER = str(ROOT / ".venv/bin/copier")

# What a placeholder in a synopsis stands for, so that the synopsis can be parsed as a command line.
PLACEHOLDERS = {"FILE": "p.properties", "S": "target", "DIR": "out", "T": "-2h", "PATH": "p", "IDS": "ids.txt"}
PLACEHOLDERS |= {"NAME": "hook", "N": "5", "R": "r.json", "TOPIC": "logs", "COMMAND": "run"}


def _examples() -> list[tuple[str, str]]:
    """(where, command) for every ``copier ...`` command line the docs show."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for language, block in re.findall(r"```([a-z]*)\n(.*?)```", text, flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                if language not in ("sh", "bash", "console") and not line.startswith("$ "):
                    continue  # a diagram or an output, not a command line
                command = re.sub(r"^\s*(\$ )?(\S+=\S+ )*(\.venv/bin/|sudo )?", "", line)
                if command.startswith("copier ") and re.match(r"copier [a-z-]+", command):
                    found.append((doc.name, command.split("  #")[0].strip()))
        for span in re.findall(r"`(copier (?:[a-z-]+|--[a-z]+)[^`]*)`", text):
            found.append((doc.name, span))
    return found


def _as_argv(command: str) -> list[str]:
    """A synopsis as a command line: optional parts included, the first of alternatives, placeholders filled."""
    command = re.split(r" [>|] ", command.replace("\\|", "|"))[0]  # a redirection or a pipe is the shell's
    command = re.sub(r"(\S+)\|\S+", r"\1", command).replace("[", "").replace("]", "")
    return [PLACEHOLDERS.get(word, word) for word in shlex.split(command)[1:]]


EXAMPLES = _examples()


def test_the_docs_show_commands() -> None:
    commands = {_as_argv(c)[0] for _, c in EXAMPLES}
    assert {"run", "verify", "check-config", "export", "audit", "status"} <= commands, commands


@pytest.mark.parametrize(("where", "command"), EXAMPLES, ids=[c for _, c in EXAMPLES])
def test_every_command_shown_parses(where: str, command: str) -> None:
    """The command and each flag exist, and each value has the form the flag takes (a command named alone, as
    in "`copier status` reads ...", need only exist)."""
    argv = _as_argv(command)
    if len(argv) == 1 and not argv[0].startswith("-"):
        argv.append("--help")
    try:
        parse(argv)
    except SystemExit as exc:
        assert exc.code == 0, f"{where}: `{command}` does not parse"


def test_every_make_target_shown_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z-]+):", makefile, flags=re.M))
    shown = {t for doc in DOCS for t in re.findall(r"`make ([a-z-]+)", doc.read_text())}
    assert shown and shown <= targets, shown - targets


def test_the_check_config_example_prints_what_the_readme_shows(tmp_path: Path) -> None:
    """README, "Configuration": a bad copier.dedupKey gives exactly the line shown, and exit status 2."""
    readme = (ROOT / "README.md").read_text()
    shown = re.search(r"\$ copier check-config bad.properties\n(copier: .*)\n", readme)
    assert shown, "the README's example is where this test looks for it"
    good = (ROOT / "properties" / "copier.properties").read_text()
    bad = re.sub(r"^copier.dedupKey *=.*$", "copier.dedupKey = body", good, flags=re.M)
    assert bad != good
    (tmp_path / "bad.properties").write_text(bad)
    run = subprocess.run(
        [COPIER, "check-config", "bad.properties"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2
    assert run.stderr.strip() == shown.group(1)


def test_help_knows_every_command_and_topic() -> None:
    for name in ["run", "verify", "exit-codes", "logs", "properties"]:
        run = subprocess.run([COPIER, "help", name], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and run.stdout, name
    assert (
        "copier.dedupWindowSeconds"
        in subprocess.run([COPIER, "help", "properties"], capture_output=True, text=True, timeout=60).stdout
    )
    wrong = subprocess.run([COPIER, "help", "exit-code"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "did you mean exit-codes?" in wrong.stderr


def _complete(script: Path, words: list[str]) -> list[str]:
    """What bash offers for the last of ``words`` (COMP_WORDS as bash sets it), with the script loaded."""
    program = (
        f"source {shlex.quote(str(script))}; COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); "
        f"COMP_CWORD={len(words) - 1}; _copier; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    run = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60, cwd=script.parent)
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


def test_bash_completion_offers_commands_flags_topics_and_files(tmp_path: Path) -> None:
    script = tmp_path / "copier.bash"
    script.write_text(subprocess.run([COPIER, "completion", "bash"], capture_output=True, text=True, check=True).stdout)
    (tmp_path / "prod.properties").touch()
    assert _complete(script, ["copier", "ver"]) == ["verify"]
    assert _complete(script, ["copier", "verify", "--ma"]) == ["--manifest"]
    assert _complete(script, ["copier", "help", "exit"]) == ["exit-codes"]
    assert _complete(script, ["copier", "run", "--properties", "pro"]) == ["prod.properties"]
    assert _complete(script, ["copier", "check-config", "--off"]) == ["--offline"]


def test_version() -> None:
    run = subprocess.run([COPIER, "--version"], capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert run.returncode == 0 and re.fullmatch(r"copier \d+\.\d+\.\d+\S*\n", run.stdout), run.stdout


def test_python_module_entry_point_is_the_same_command_line() -> None:
    run = subprocess.run([sys.executable, "-m", "copier.commands.cli", "help", "logs"], capture_output=True, text=True)
    assert run.returncode == 0 and "journalctl -u copier -p warning" in run.stdout
