"""The user guides, run as written: README.md's "The same in separate terminals" and every
guide in docs/guide/. The commands and programs are extracted from the Markdown, run, and
their outputs checked, so the guides cannot silently go out of date.

Markers. An HTML comment on the line right before a fenced block (GitHub does not show it)
says what the test does with the block:

``<!-- guide-test: file=NAME -->``
    save the block as NAME in the working directory.
``<!-- guide-test: run [id=NAME] -->``
    run each command of the block to completion in bash, in order; each must exit with
    status 0 within 30 s. A command is a line, plus the lines a trailing backslash joins to
    it, plus the lines bash needs to complete it (a ``for ... done``). With ``id``, the
    check ``CHECKS[NAME]`` gets the outputs.
``<!-- guide-test: python [id=NAME] -->``
    save the block as a program and run it with ``python``; as ``run`` otherwise.
``<!-- guide-test: output -->``
    what the preceding ``run`` block printed, exactly (its commands' standard outputs).
``<!-- guide-test: terminal=NAME [ready=COND,...] -->``
    what one terminal runs: the block runs in bash in the background, its last command
    keeps running (a server or a worker); then the test waits for every COND.
``<!-- guide-test: terminals [ready=COND,...] -->``
    one terminal per line (the README's compact form): a line ending in ``# once`` runs to
    completion, every other line keeps running in the background.
``<!-- guide-test: not-run reason="..." -->``
    not run, for the reason given (it installs software, needs a second machine, or is an
    example of data rather than a command).

A marker that no fence follows is an action:

``<!-- guide-test: ctrl-c=NAME -->``
    Ctrl-C in terminal NAME: SIGINT to the process it runs, which must then exit by itself,
    with status 0, within 20 s.

Conditions: ``http:PORT`` (``GET /live`` answers 200), ``model:PORT:NAME:COUNT`` (the
frontend on PORT lists COUNT instances of model NAME on ``/health``), ``etcd:PORT`` (etcd's
``/health`` says true), ``tcp:PORT`` (something accepts connections).

Every fenced block of docs/guide/*.md and of the README section carries a marker, and every
``id`` has its check (``test_every_block_has_a_marker``), so nothing in a guide goes
untested by accident.

What the test changes in what the guides say, and nothing else:

* a line ``source .venv/bin/activate`` is the environment of the interpreter running this
  test (its ``bin/`` first in ``PATH``);
* the example ports of the guides (8000, 8081, 2379, 2380, 4222; the guides say they are
  the reader's choice) become free loopback ports, in the markers too;
* ``/tmp/tiny-model`` becomes a directory of the test's own;
* everything runs in a temporary working directory, with ``DYN_FILE_KV`` in it (so the
  processes of one guide find only each other), ``DYN_HTTP_HOST`` and ``DYN_SYSTEM_HOST``
  set to 127.0.0.1 (nothing listens beyond loopback) and no ``DYN_*``, ``ETCD_*`` or
  ``NATS_*`` variable of the caller's environment.

Whatever happens, every terminal still running at the end gets SIGTERM, then SIGKILL 10 s
later.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from serving_util import free_port

REPO = Path(__file__).resolve().parent.parent
GUIDES = REPO / "docs" / "guide"
README_SECTION = "### The same in separate terminals"
ACTIVATE = "source .venv/bin/activate"
EXAMPLE_PORTS = ("8000", "8081", "2379", "2380", "4222")
MODEL_DIR = "/tmp/tiny-model"
COMMAND_TIMEOUT = 30.0
READY_TIMEOUT = 30.0
EXIT_TIMEOUT = 20.0

MARKER = re.compile(r"^<!-- guide-test: (.*) -->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")


# --- the Markdown ---------------------------------------------------------------------


@dataclass
class Step:
    """A marked fenced block, or an action marker; ``line`` is 1-based."""

    kind: str
    options: dict[str, str]
    line: int
    lang: str | None = None
    body: str | None = None


def parse(text: str, first_line: int = 1) -> tuple[list[Step], list[int]]:
    """The steps of ``text``, and the lines of the fences that carry no marker."""
    lines = text.splitlines()
    steps: list[Step] = []
    unmarked: list[int] = []
    i = 0
    while i < len(lines):
        marker = MARKER.match(lines[i])
        fence = FENCE.match(lines[i])
        if marker:
            words = shlex.split(marker.group(1))
            kind, _, value = words[0].partition("=")
            options = dict(w.partition("=")[::2] for w in words[1:])
            if value:
                options[kind] = value
            step = Step(kind, options, first_line + i)
            if i + 1 < len(lines) and (opening := FENCE.match(lines[i + 1])):
                end = lines.index("```", i + 2)
                step.lang, step.body = opening.group(1), "\n".join(lines[i + 2 : end]) + "\n"
                i = end
            steps.append(step)
        elif fence:
            unmarked.append(first_line + i)
            i = lines.index("```", i + 1)
        i += 1
    return steps, unmarked


def readme_section() -> tuple[str, int]:
    """README.md's "The same in separate terminals", up to the next heading, and its
    first line's number."""
    lines = (REPO / "README.md").read_text().splitlines()
    start = lines.index(README_SECTION)
    end = next(i for i in range(start + 1, len(lines)) if re.match(r"#{1,3} ", lines[i]))
    return "\n".join(lines[start:end]) + "\n", start + 1


def guide_files() -> list[Path]:
    return sorted(GUIDES.glob("*.md"))


# --- running it -----------------------------------------------------------------------


@dataclass
class Output:
    command: str
    stdout: str
    stderr: str


@dataclass
class Terminal:
    name: str
    proc: subprocess.Popen
    log: Path


@dataclass
class Walk:
    """One guide run in its own working directory and environment."""

    work: Path
    ports: dict[str, str] = field(default_factory=dict)
    terminals: dict[str, Terminal] = field(default_factory=dict)
    last_run: list[Output] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ports = {p: str(free_port()) for p in EXAMPLE_PORTS}
        self.model_dir = self.work / "tiny-model"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "ETCD_", "NATS_"))}
        bindir = Path(sys.executable).parent
        env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(bindir.parent)
        env["DYN_FILE_KV"] = str(self.work / "discovery")
        env["DYN_HTTP_HOST"] = env["DYN_SYSTEM_HOST"] = "127.0.0.1"
        # curl and the OpenAI client must not send loopback requests to a proxy.
        env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1"
        self.env = env

    # What the test changes (see the module docstring).
    def substitute(self, text: str) -> str:
        text = re.sub(
            r"(?<![\d.])(8000|8081|2379|2380|4222)(?!\d)", lambda m: self.ports[m[1]], text
        )
        return text.replace(MODEL_DIR, str(self.model_dir))

    def port(self, example: str) -> int:
        return int(self.ports[example])

    def logs(self) -> str:
        parts = []
        for t in self.terminals.values():
            tail = t.log.read_text(errors="replace")[-3000:] if t.log.exists() else ""
            parts.append(f"--- terminal {t.name} (exit {t.proc.poll()}) ---\n{tail}")
        return "\n".join(parts)

    # Blocks.
    def run_commands(self, script: str) -> list[Output]:
        outputs = []
        for command in split_commands(script):
            if is_activate(command):
                continue
            out = self.run_one(["bash", "-c", command], command)
            outputs.append(out)
        return outputs

    def run_one(self, argv: list[str], what: str) -> Output:
        proc = subprocess.Popen(
            argv,
            cwd=self.work,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            kill_group(proc, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            raise AssertionError(
                f"{what!r} ran over {COMMAND_TIMEOUT} s\n{stdout}\n{stderr}\n{self.logs()}"
            ) from None
        assert proc.returncode == 0, (
            f"{what!r} exited with {proc.returncode}\n{stdout}\n{stderr}\n{self.logs()}"
        )
        return Output(what, stdout, stderr)

    def start_terminal(self, name: str, script: str) -> None:
        old = self.terminals.get(name)
        assert old is None or old.proc.poll() is not None, f"terminal {name} is still busy"
        lines = [line for line in script.splitlines() if not is_activate(line)]
        log = self.work / f"terminal-{name}.log"
        with open(log, "ab") as f:
            proc = subprocess.Popen(
                ["bash", "-c", "\n".join(lines)],
                cwd=self.work,
                env=self.env,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.terminals[name] = Terminal(name, proc, log)

    def wait_ready(self, conditions: str) -> None:
        for cond in filter(None, conditions.split(",")):
            deadline = time.monotonic() + READY_TIMEOUT
            while not self.holds(cond):
                for t in self.terminals.values():
                    assert t.proc.poll() is None or t.proc.returncode == 0, (
                        f"terminal {t.name} exited with {t.proc.returncode} while waiting "
                        f"for {cond}\n{self.logs()}"
                    )
                assert time.monotonic() < deadline, f"never {cond}\n{self.logs()}"
                time.sleep(0.1)

    def holds(self, cond: str) -> bool:
        kind, _, rest = cond.partition(":")
        if kind == "http":
            return http_get(f"http://127.0.0.1:{rest}/live")[0] == 200
        if kind == "etcd":
            status, body = http_get(f"http://127.0.0.1:{rest}/health")
            return status == 200 and json.loads(body).get("health") == "true"
        if kind == "tcp":
            try:
                with socket.create_connection(("127.0.0.1", int(rest)), timeout=1):
                    return True
            except OSError:
                return False
        if kind == "model":
            port, model, count = rest.split(":")
            status, body = http_get(f"http://127.0.0.1:{port}/health")
            if status != 200:
                return False
            models = json.loads(body)["models"]
            return any(m["model"] == model and len(m["instances"]) == int(count) for m in models)
        raise AssertionError(f"unknown condition {cond!r}")

    def ctrl_c(self, name: str) -> None:
        t = self.terminals[name]
        assert t.proc.poll() is None, f"terminal {name} already ended\n{self.logs()}"
        signal_foreground(t.proc, signal.SIGINT)
        try:
            rc = t.proc.wait(EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still runs {EXIT_TIMEOUT} s after Ctrl-C") from None
        assert rc == 0, f"{name} exited with {rc} after Ctrl-C\n{self.logs()}"

    def close(self) -> None:
        running = [t for t in self.terminals.values() if t.proc.poll() is None]
        for t in running:
            signal_foreground(t.proc, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for t in running:
            try:
                t.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            kill_group(t.proc, signal.SIGKILL)
            t.proc.wait()


def is_activate(command: str) -> bool:
    """Whether ``command`` is the guides' ``source .venv/bin/activate`` (comment aside)."""
    return re.sub(r"\s+#.*$", "", command).strip() == ACTIVATE


def split_commands(script: str) -> list[str]:
    """The commands of a shell block: lines joined by trailing backslashes, then as many
    lines as bash needs to complete a command (``bash -n``); blank lines and comment-only
    lines are skipped."""
    commands: list[str] = []
    pending = ""
    for line in script.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line + "\n"
        if line.endswith("\\"):
            continue
        check = subprocess.run(["bash", "-n"], input=pending, capture_output=True, text=True)
        if check.returncode == 0:
            commands.append(pending.rstrip("\n"))
            pending = ""
    assert not pending, f"incomplete command: {pending!r}"
    return commands


def http_get(url: str) -> tuple[int | None, bytes]:
    """``(status, body)``; ``(None, b"")`` when nothing answers HTTP there."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, ValueError):
        return None, b""


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces) close with ")".
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def signal_foreground(proc: subprocess.Popen, sig: int) -> None:
    """Signal what the terminal runs in the foreground: the processes of its group other
    than the shell (bash waits for them and then ends), or the shell when it already
    replaced itself with the command."""
    members = group_members(proc.pid)
    targets = []
    for pid in members:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm != "bash":
            targets.append(pid)
    for pid in targets or [proc.pid]:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def walk(steps: list[Step], work: Path) -> None:
    """Run ``steps`` in order, in ``work``; each ``id`` block's outputs go to its check."""
    w = Walk(work)
    try:
        for step in steps:
            opts = {k: w.substitute(v) for k, v in step.options.items()}
            body = w.substitute(step.body) if step.body is not None else None
            where = f"(line {step.line})"
            if step.kind == "file":
                (work / opts["file"]).write_text(body or "")
            elif step.kind == "run":
                assert body is not None, where
                w.last_run = w.run_commands(body)
            elif step.kind == "python":
                program = work / f"program-{step.line}.py"
                program.write_text(body or "")
                w.last_run = [w.run_one(["python", str(program)], f"python block {where}")]
            elif step.kind == "output":
                printed = "".join(o.stdout for o in w.last_run)
                assert printed.strip() == (body or "").strip(), (
                    f"{where} the guide shows\n{body}but the commands printed\n{printed}"
                )
            elif step.kind == "terminal":
                w.start_terminal(opts["terminal"], body or "")
                w.wait_ready(opts.get("ready", ""))
            elif step.kind == "terminals":
                for n, command in enumerate(split_commands(body or "")):
                    if is_activate(command):
                        continue
                    if command.rstrip().endswith("# once"):
                        w.run_commands(command)
                    else:
                        w.start_terminal(f"line-{n}", command)
                w.wait_ready(opts.get("ready", ""))
            elif step.kind == "ctrl-c":
                w.ctrl_c(opts["ctrl-c"])
            elif step.kind == "not-run":
                continue
            else:
                raise AssertionError(f"{where} unknown marker {step.kind!r}")
            if "id" in opts:
                CHECKS[opts["id"]](w, w.last_run)
    finally:
        w.close()


# --- what the outputs must say ----------------------------------------------------------


def as_json(out: Output) -> dict:
    try:
        return json.loads(out.stdout)
    except ValueError:
        raise AssertionError(f"{out.command!r} printed no JSON: {out.stdout!r}") from None


def sse_events(out: Output) -> list[str]:
    return [line[len("data: ") :] for line in out.stdout.splitlines() if line.startswith("data: ")]


def check_models(out: Output, *names: str) -> None:
    got = sorted(m["id"] for m in as_json(out)["data"])
    assert got == sorted(names), got


def check_chat(out: Output, model: str, max_tokens: int | None = None) -> str:
    body = as_json(out)
    assert body["object"] == "chat.completion", body
    assert body["model"] == model, body
    content = body["choices"][0]["message"]["content"]
    assert content, body
    if max_tokens is not None:
        assert body["usage"]["completion_tokens"] == max_tokens, body
        assert body["choices"][0]["finish_reason"] == "length", body
    return content


def check_stream(out: Output, model: str) -> str:
    events = sse_events(out)
    assert events and events[-1] == "[DONE]", out.stdout
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["model"] == model for c in chunks), chunks
    assert chunks[-1]["choices"][0]["finish_reason"] == "length", chunks[-1]
    text = "".join(
        c["choices"][0].get("delta", {}).get("content") or c["choices"][0].get("text") or ""
        for c in chunks
    )
    assert text, out.stdout
    return text


def check_health_instances(out: Output, model: str, count: int) -> None:
    body = as_json(out)
    assert body["status"] == "healthy", body
    entry = next(m for m in body["models"] if m["model"] == model)
    assert len(entry["instances"]) == count, body


def samples(out: Output, family: str) -> list[float]:
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in out.stdout.splitlines()
        if line.startswith(family + "{")
    ]
    assert values, f"no {family} in {out.stdout!r}"
    return values


def check_readme_commands(w: Walk, outs: list[Output]) -> None:
    models, chat, stream, metrics = outs
    check_models(models, "tiny")
    check_chat(chat, "tiny", max_tokens=16)
    check_stream(stream, "tiny")
    assert sum(samples(metrics, "dynamo_frontend_requests_total")) >= 2, metrics.stdout


def check_openai_client(w: Walk, outs: list[Output]) -> None:
    assert outs[0].stdout.strip(), outs[0]


def check_tiny_model(w: Walk, outs: list[Output]) -> None:
    (out,) = outs
    assert out.stdout.strip() == str(w.model_dir), out.stdout
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (w.model_dir / name).is_file(), name


def check_first_requests(w: Walk, outs: list[Output]) -> None:
    models, chat = outs
    check_models(models, "tiny")
    check_chat(chat, "tiny", max_tokens=16)
    assert as_json(chat)["usage"]["prompt_tokens"] == 13, chat.stdout


def check_quick_stream(w: Walk, outs: list[Output]) -> None:
    check_stream(outs[0], "tiny")


def check_quick_health(w: Walk, outs: list[Output]) -> None:
    check_health_instances(outs[0], "tiny", 2)


def check_openai_usage(w: Walk, outs: list[Output]) -> None:
    lines = outs[0].stdout.strip().splitlines()
    assert len(lines) >= 2 and "completion_tokens=16" in lines[-1], outs[0].stdout


def check_model_gone(w: Walk, outs: list[Output]) -> None:
    check_models(outs[0])


def check_echo_chat(w: Walk, outs: list[Output]) -> None:
    models, chat = outs
    check_models(models, "echo")
    content = check_chat(chat, "echo", max_tokens=16)
    assert content == "user\nHello there!\nassistant\nuser\nHello", content


def check_echo_completion(w: Walk, outs: list[Output]) -> None:
    plain, streamed = outs
    body = as_json(plain)
    assert body["choices"][0]["text"] == "The quick brown foxThe quick brown fox", body
    assert check_stream(streamed, "echo") == "The quick brown foxThe quick brown fox"


def check_two_workers(w: Walk, outs: list[Output]) -> None:
    check_health_instances(outs[0], "echo", 2)


def check_one_worker_left(w: Walk, outs: list[Output]) -> None:
    check_chat(outs[0], "echo", max_tokens=4)


def cached_lines(outs: list[Output]) -> list[int]:
    return [int(line.split(":")[1]) for o in outs for line in o.stdout.split()]


def check_kv_cached(w: Walk, outs: list[Output]) -> None:
    assert cached_lines(outs) == [0, 48, 48], outs


def check_round_robin_cached(w: Walk, outs: list[Output]) -> None:
    assert cached_lines(outs) == [0, 0, 48], outs


def check_kv_metrics(w: Walk, outs: list[Output]) -> None:
    assert samples(outs[0], "dynamo_router_kv_events_applied_total") == [1.0], outs[0].stdout


def check_busy_threshold(w: Walk, outs: list[Output]) -> None:
    listed, changed = (as_json(o) for o in outs)
    entry = next(t for t in listed["thresholds"] if t["model"] == "kv-echo")
    assert entry["active_decode_blocks_threshold"] is None, listed
    assert changed["model"] == "kv-echo", changed
    assert changed["active_decode_blocks_threshold"] == 0.9, changed


def check_etcd_chat(w: Walk, outs: list[Output]) -> None:
    check_chat(outs[0], "tiny", max_tokens=16)


def check_etcd_keys(w: Walk, outs: list[Output]) -> None:
    keys = outs[0].stdout.split()
    generate = [k for k in keys if k.startswith("v1/instances/dynamo/backend/generate/")]
    assert len(generate) == 2, keys


def check_nats_transport(w: Walk, outs: list[Output]) -> None:
    transports, chat = outs
    kinds = transports.stdout.split()
    assert kinds and all(k == '"transport":{"nats_tcp"' for k in kinds), kinds
    check_chat(chat, "tiny", max_tokens=16)


def check_frontend_health(w: Walk, outs: list[Output]) -> None:
    live, health, ready = (as_json(o) for o in outs)
    assert live == {"status": "live", "message": "Service is live"}, live
    assert health["status"] == "healthy", health
    assert ready["ready"] is True and ready["model"] == "tiny", ready


def check_worker_health(w: Walk, outs: list[Output]) -> None:
    for body in (as_json(o) for o in outs):
        assert body["status"] == "ready", body
        assert body["endpoints"]["dynamo.backend.generate"] == "ready", body


def check_metrics(w: Walk, outs: list[Output]) -> None:
    chat, frontend, worker = outs
    check_chat(chat, "tiny", max_tokens=16)
    assert (
        'dynamo_frontend_requests_total{model="tiny",endpoint="chat_completions",'
        'request_type="unary",status="success"} 1'
    ) in frontend.stdout.splitlines(), frontend.stdout
    generate = [
        line
        for line in worker.stdout.splitlines()
        if 'dynamo_endpoint="generate"' in line and line.endswith(" 1")
    ]
    assert generate, worker.stdout


def check_after_shutdown(w: Walk, outs: list[Output]) -> None:
    ready, models = (as_json(o) for o in outs)
    assert ready["error"]["message"].startswith("The model `tiny` does not exist."), ready
    assert models["data"] == [], models


def check_json_log(w: Walk, outs: list[Output]) -> None:
    record = as_json(outs[0])
    assert record["level"] == "INFO", record
    assert record["fields"]["message"] == "OpenAI frontend listening", record
    assert record["target"] == "dynamo_frontend::http", record


CHECKS: dict[str, Callable[[Walk, list[Output]], None]] = {
    "readme-commands": check_readme_commands,
    "readme-openai": check_openai_client,
    "tiny-model": check_tiny_model,
    "first-requests": check_first_requests,
    "stream": check_quick_stream,
    "health": check_quick_health,
    "openai-client": check_openai_usage,
    "model-gone": check_model_gone,
    "echo-chat": check_echo_chat,
    "echo-completion": check_echo_completion,
    "two-workers": check_two_workers,
    "one-worker-left": check_one_worker_left,
    "kv-cached": check_kv_cached,
    "kv-metrics": check_kv_metrics,
    "round-robin-cached": check_round_robin_cached,
    "kv-echo-cached": check_kv_cached,
    "busy-threshold": check_busy_threshold,
    "etcd-chat": check_etcd_chat,
    "etcd-keys": check_etcd_keys,
    "nats-transport": check_nats_transport,
    "frontend-health": check_frontend_health,
    "worker-health": check_worker_health,
    "metrics": check_metrics,
    "after-shutdown": check_after_shutdown,
    "json-log": check_json_log,
}


# --- the tests ------------------------------------------------------------------------


def all_documents() -> list[tuple[str, list[Step], list[int]]]:
    section, first = readme_section()
    docs = [("README.md", *parse(section, first))]
    docs += [(f"docs/guide/{p.name}", *parse(p.read_text())) for p in guide_files()]
    return docs


#: The language of the fence each kind of block takes (None: any); actions take none.
BLOCK_LANGS = {
    "file": None,
    "run": "bash",
    "python": "python",
    "output": "text",
    "terminal": "bash",
    "terminals": "bash",
    "not-run": None,
}
ACTIONS = {"ctrl-c"}


def test_every_block_has_a_marker() -> None:
    """Every fenced block is run, saved, compared or explicitly not run; actions carry no
    block; and the ids and checks match one to one."""
    ids = []
    for name, steps, unmarked in all_documents():
        assert not unmarked, f"{name}: fenced blocks without a guide-test marker at {unmarked}"
        for s in steps:
            where = f"{name}:{s.line}"
            if s.kind in ACTIONS:
                assert s.body is None, f"{where}: an action followed by a fence"
            else:
                assert s.kind in BLOCK_LANGS, f"{where}: unknown marker {s.kind!r}"
                assert s.body is not None, f"{where}: {s.kind} without a fenced block"
                want = BLOCK_LANGS[s.kind]
                assert want is None or s.lang == want, f"{where}: {s.kind} on ```{s.lang}"
            if s.kind == "not-run":
                assert s.options.get("reason"), f"{where}: not-run without a reason"
        ids += [s.options["id"] for s in steps if "id" in s.options]
    assert len(ids) == len(set(ids)), ids
    assert sorted(ids) == sorted(CHECKS), set(ids) ^ set(CHECKS)
    guides = [p.name for p in guide_files()]
    assert guides[0] == "01-quick-start.md" and "README.md" in guides, guides


def test_guide_links_resolve() -> None:
    """Relative links of the guides (and of the design notes' index) point at files that
    exist, and the README links the worker guide."""
    for path in [*guide_files(), REPO / "docs" / "design" / "README.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.name}: broken link {target}"
    readme = (REPO / "README.md").read_text()
    assert "docs/guide/02-your-own-worker.md" in readme


def test_readme_separate_terminals(tmp_path: Path) -> None:
    """README.md's "The same in separate terminals", as written."""
    section, first = readme_section()
    steps, _ = parse(section, first)
    assert [s.kind for s in steps][:2] == ["terminals", "run"], steps
    walk(steps, tmp_path)


@pytest.mark.parametrize("guide", [p.name for p in guide_files()])
def test_guide(guide: str, tmp_path: Path) -> None:
    """One guide of docs/guide/, from its first command to its last, as written."""
    steps, _ = parse((GUIDES / guide).read_text())
    walk(steps, tmp_path)
