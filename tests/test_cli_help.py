"""Every command line explains every option (issue 54, item 7).

``python -m <command> --help`` of each entry point is parsed: every option must have help
text, the commands that read the environment list the variables in their help, and a
mistyped flag ends with a one-line usage error (exit 2), not a traceback.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

COMMANDS = [
    "dynamo.frontend",
    "dynamo.mocker",
    "dynamo.planner",
    "dynamo.replay",
    "dynamo.indexer",
    "dynamo.select_service",
    "dynamo.slot_tracker",
    "dynamo.llm.tiny_model",
]
# Commands that start a runtime, and so read the discovery / request-plane variables.
RUNTIME_COMMANDS = ["dynamo.frontend", "dynamo.mocker", "dynamo.planner"]

# An option entry of argparse's or clap's help: two spaces, then `-x`/`--xyz`.
OPTION = re.compile(r"^  {1,4}(-\w|--[\w-]+)")


def _help(command: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def options_without_help(text: str) -> list[str]:
    """The option entries of a help text that carry no description.

    An entry's description is either on its own line after two or more spaces, or on the
    lines below it, indented deeper than the option itself.
    """
    lines = text.splitlines()
    missing = []
    for i, line in enumerate(lines):
        m = OPTION.match(line)
        if not m:
            continue
        if re.search(r"\S {2,}\S", line.strip()):
            continue  # `--flag VALUE   description`
        indent = len(line) - len(line.lstrip())
        below = lines[i + 1] if i + 1 < len(lines) else ""
        below_indent = len(below) - len(below.lstrip())
        if below.strip() and below_indent > indent and not OPTION.match(below):
            continue
        missing.append(line.strip())
    return missing


def test_the_parser_of_this_test_finds_an_option_without_help() -> None:
    text = (
        "options:\n"
        "  -h, --help            show this help message and exit\n"
        "  --documented N        what it does (default: 1)\n"
        "  --bare BARE\n"
        "  --long-one LONG_ONE_VALUE_NAME_THAT_WRAPS\n"
        "                        its description, below\n"
        "  --last\n"
    )
    assert options_without_help(text) == ["--bare BARE", "--last"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help(command: str) -> None:
    text = _help(command)
    assert any(OPTION.match(line) for line in text.splitlines()), text
    assert options_without_help(text) == [], f"{command} --help:\n{text}"


@pytest.mark.parametrize("command", RUNTIME_COMMANDS)
def test_runtime_commands_list_the_environment(command: str) -> None:
    text = _help(command)
    for var in ("DYN_DISCOVERY_BACKEND", "DYN_FILE_KV", "ETCD_ENDPOINTS", "NATS_SERVER", "DYN_LOG"):
        assert var in text, f"{command} --help does not mention {var}"


# The arguments a command requires, so that the mistyped flag is what it complains about.
REQUIRED = {
    "dynamo.mocker": ["--model-path", "/nonexistent"],
    "dynamo.replay": ["/nonexistent.jsonl"],
    "dynamo.llm.tiny_model": ["/nonexistent"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_mistyped_flag_is_a_usage_error_not_a_traceback(command: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", command, *REQUIRED.get(command, []), "--no-such-flag"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    assert "--no-such-flag" in out.stderr, out.stderr
