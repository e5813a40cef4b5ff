"""The documentation is checked: the error reference is generated, the refund diagram is the
definition's, and the examples run.

Fenced blocks in README.md and docs/*.md are handled by their info string:

- ```python               executed, in document order, in one namespace per file;
- ```LANG file=NAME       written to NAME in the working directory, not executed
                          (a workflow module to import, a roles file, a model script);
- ```console / ```bash    run, command by command. In `console` blocks each line
                          starting with `$ ` is a command and the lines under it are
                          what it prints (see below); in `bash` blocks every line is
                          a command. A
                          command is `railyard ...` (the venv's, optionally after
                          `NAME=VALUE` words for that command alone), `export NAME=VALUE`,
                          or `NAME=$(railyard ...)`; `$NAME` expands; `railyard ... > FILE`
                          writes its stdout to FILE; `# ...` at the end is a comment. A
                          trailing `# exit N` expects exit status N (default 0), and
                          `# exit N CODE` also expects `CODE:` on stderr;
- ```LANG no-run          shown only, never run: a Python fragment, or commands a test
                          cannot run (a server that runs until stopped such as
                          `railyard serve` or `railyard worker` without `--once`, `make`,
                          `alembic`, anything that needs a provider key or PostgreSQL).
                          Any other console or bash block must run: a command that is
                          not `railyard` fails the test until its block says `no-run`.

In the pages of `COMPARED`, what a console block shows under a command is compared with what
the command printed to a terminal `TERMINAL_COLUMNS` wide (its stdout and stderr, as they came),
line by line, spaces at either end aside, with placeholders for what changes from run to run:
any task id (a UUID, or its first 8 characters), hex digest, time and worker name stands for
any other; `…` or `...` in a line stands for any text; a line that is `...` alone stands for any
number of lines. A command shown without output is not compared; nor is a `console demo` block
(tests/test_demo.py is).

`NOT_MARKED_YET` lists, by file and command, the few commands that cannot run but sit in
pages whose owners have not marked them `no-run` yet; each entry must still match a command
(`test_not_marked_yet_is_current`), so the list only shrinks.

Every file runs in a fresh temporary directory, with RAILYARD_DATABASE_URL pointing
at a SQLite file there that is migrated first.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from engine import Engine, migrations

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: (file, command as written after `$ `) -> why it cannot run. Only for pages someone else is editing; elsewhere
#: mark the block `console no-run`. Remove an entry once its block is marked.
NOT_MARKED_YET: dict[tuple[str, str], str] = {}
RAILYARD = Path(sys.executable).parent / "railyard"
#: The pages whose console blocks' output is compared with what the commands print (issue #29's "docs that run").
COMPARED = frozenset({"README.md", "tutorial.md", "operations.md"})

FENCE = re.compile(r"^(\s*)```(.*)$")
EXPECT = re.compile(r"\s+#\s*exit\s+(\d+)(?:\s+([A-Z_]+))?\s*$")
ASSIGN = re.compile(r"^([A-Za-z_]\w*)=\$\((.*)\)$")
EXPORT = re.compile(r"^export\s+([A-Za-z_]\w*)=(.*)$")
REDIRECT = re.compile(r"\s+>\s*([\w.-]+)$")
SETTING = re.compile(r"^[A-Za-z_]\w*=")
VARIABLE = re.compile(r"\$(?:\{([A-Za-z_]\w*)\}|([A-Za-z_]\w*))")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # line number of the block's first body line
    lang: str
    options: tuple[str, ...]
    text: str

    def option(self, name: str) -> str | None:
        for option in self.options:
            key, _, value = option.partition("=")
            if key == name:
                return value or key
        return None


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, in order."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, info = opening.group(1), opening.group(2).split()
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i].removeprefix(indent))
            i += 1
        start = i - len(body) + 1
        found.append(Block(path, start, info[0] if info else "", tuple(info[1:]), "\n".join(body) + "\n"))
        i += 1
    return found


def run_python(block: Block, namespace: dict[str, Any]) -> None:
    # Leading newlines make tracebacks point at the right line of the Markdown file.
    code = compile("\n" * (block.line - 1) + block.text, str(block.path), "exec")
    exec(code, namespace)


def commands(block: Block) -> list[tuple[int, str]]:
    """(line number, command) pairs, with backslash continuations joined."""
    out: list[tuple[int, str]] = []
    pending = ""
    for offset, raw in enumerate(block.text.splitlines()):
        if not pending:
            if block.lang == "console":
                if not raw.startswith("$ "):
                    continue
                raw = raw[2:]
            elif not raw.strip() or raw.lstrip().startswith("#"):
                continue
            first = block.line + offset
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        out.append((first, pending + raw))
        pending = ""
    return out


def outputs(block: Block) -> list[list[str]]:
    """What a console block shows under each of its commands (in `commands`' order): the lines up to the next
    command, without the blank lines that end the block."""
    shown: list[list[str]] = []
    if block.lang != "console":
        return [[] for _ in commands(block)]
    continued = False
    for raw in block.text.splitlines():
        if continued:
            continued = raw.endswith("\\")
        elif raw.startswith("$ "):
            shown.append([])
            continued = raw.endswith("\\")
        elif shown:
            shown[-1].append(raw)
    for lines in shown:
        while lines and not lines[-1].strip():
            lines.pop()
    return shown


#: What changes from run to run, each matched by its kind: (pattern, placeholder), applied in this order.
PLACEHOLDERS = (
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
    (re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})?"), "<time>"),
    (re.compile(r"\d{8}T\d{6}Z"), "<time>"),
    (re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{12,64}\b"), "<hex>"),
    (re.compile(r"\b[\w.-]+-\d+-[0-9a-f]{6}(?=: )"), "<worker>"),
    (re.compile(r"\b[0-9a-f]{8}\b"), "<id8>"),  # a task id as the tables show it, by its first 8 characters
)
ELLIPSIS = re.compile(r"…|\.\.\.")


def placeheld(line: str) -> str:
    for pattern, placeholder in PLACEHOLDERS:
        line = pattern.sub(placeholder, line)
    return line.strip()


def line_pattern(shown: str) -> re.Pattern[str]:
    """A line the page shows as a pattern of printed lines: placeholders for ids and times, `…` for any text."""
    return re.compile(".*".join(re.escape(part) for part in ELLIPSIS.split(placeheld(shown))))


def matches(shown: list[str], printed: list[str]) -> bool:
    """Whether the printed lines are the lines shown, a `...` line standing for any number of them."""
    if not shown:
        return not printed
    if shown[0].strip() == "...":
        return any(matches(shown[1:], printed[i:]) for i in range(len(printed) + 1))
    return (
        bool(printed)
        and line_pattern(shown[0]).fullmatch(placeheld(printed[0])) is not None
        and matches(shown[1:], printed[1:])
    )


#: A terminal's escape sequences: colours and styles (CSI ... m) and links (OSC 8).
STYLES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x1b\x07]*(?:\x07|\x1b\\)")
#: The terminal the pages' output is drawn for: what a console block shows is what a person sees in one.
TERMINAL_COLUMNS = 160


def in_terminal(argv: list[str], *, env: dict[str, str], cwd: Path, **_: Any) -> subprocess.CompletedProcess[str]:
    """Run `argv` with its stdout and stderr a terminal TERMINAL_COLUMNS wide (a pseudo-terminal), stdin empty, as
    `subprocess.run(..., capture_output=True, text=True)` would: what the terminal showed, both streams in the
    order they were written and without their colours and styles, is the result's stdout and its stderr alike.
    (TERM=dumb would leave the styles out too, but Rich then draws for 80 columns whatever the terminal's size.)"""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, TERMINAL_COLUMNS, 0, 0))
    terminal = {**env, "TERM": "xterm", "COLUMNS": str(TERMINAL_COLUMNS)}
    terminal.pop("TERMINAL_WIDTH", None)
    with subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=terminal, cwd=cwd
    ) as process:
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the command closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        returncode = process.wait(timeout=120)
    shown = STYLES.sub("", b"".join(chunks).decode("utf-8", errors="replace").replace("\r\n", "\n"))
    return subprocess.CompletedProcess(argv, returncode, shown, shown)


def expand(command: str, env: dict[str, str], where: str) -> str:
    """Replace `$NAME` and `${NAME}` with their values (quotes are not special, unlike in a shell)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in env, f"{where}: ${name} is not set"
        return env[name]

    return VARIABLE.sub(value, command)


def without_comment(command: str) -> str:
    """`command` without a trailing shell comment (a `#` that starts a word outside quotes)."""
    quote = ""
    for i, char in enumerate(command):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or command[i - 1].isspace()):
            return command[:i].rstrip()
    return command


def run_shell(block: Block, env: dict[str, str], cwd: Path) -> None:
    for (line, written), page in zip(commands(block), outputs(block), strict=True):
        where = f"{block.path.name}:{line}: {written}"
        if (block.path.name, written) in NOT_MARKED_YET:
            continue
        command, expected_exit, expected_code = written, 0, None
        expect = EXPECT.search(command)
        if expect:
            expected_exit, expected_code = int(expect.group(1)), expect.group(2)
            command = command[: expect.start()]
        command = expand(without_comment(command).strip(), env, where)

        if export := EXPORT.match(command):
            env[export.group(1)] = " ".join(shlex.split(export.group(2)))
            continue
        target = None
        if assign := ASSIGN.match(command):
            target, command = assign.group(1), assign.group(2)
        into = None
        if redirect := REDIRECT.search(command):
            into, command = cwd / redirect.group(1), command[: redirect.start()]
        argv = shlex.split(command)
        scoped = dict(env)
        while argv and SETTING.match(argv[0]):
            name, _, value = argv.pop(0).partition("=")
            scoped[name] = value
        assert argv and argv[0] == "railyard", (
            f"{where}: only `railyard` commands run; mark its block `no-run` if it cannot run in a test"
        )
        # A command whose output the page shows runs as a person runs it, its stdout a terminal (tables and JSON
        # are drawn for one); a command whose output is captured or not shown, as a script runs it.
        compared = block.path.name in COMPARED and block.option("demo") is None and bool(page) and into is None
        run = in_terminal if compared and target is None else subprocess.run
        result = run(
            [str(RAILYARD), *argv[1:]], env=scoped, cwd=cwd, capture_output=True, text=True, timeout=120, check=False
        )
        shown = f"{where}\n--- stdout\n{result.stdout}--- stderr\n{result.stderr}"
        assert result.returncode == expected_exit, f"exit {result.returncode}, expected {expected_exit}: {shown}"
        if expected_code is not None:
            assert f"{expected_code}:" in result.stderr, f"expected {expected_code} on stderr: {shown}"
        printed = (result.stdout if run is in_terminal else result.stdout + result.stderr).rstrip().splitlines()
        # A `console demo` block shows what `make demo` leaves: tests/test_demo.py compares it after the demo.
        if compared:
            assert matches(page, printed), (
                f"{where}: the page shows\n" + "\n".join(page) + "\n--- but it printed\n" + "\n".join(printed)
            )
        if target is not None:
            env[target] = result.stdout.strip()
        if into is not None:
            into.write_text(result.stdout, encoding="utf-8")


def _tool(name: str) -> ModuleType:
    if str(REPO / "tools") not in sys.path:  # the generators import their shared `docgen` as a sibling script
        sys.path.insert(0, str(REPO / "tools"))
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gen_errors_doc() -> ModuleType:
    return _tool("gen_errors_doc")


def test_error_reference_is_generated_from_the_enum() -> None:
    doc = REPO / "docs" / "errors.md"
    text = doc.read_text(encoding="utf-8")
    assert _gen_errors_doc().regenerate(text) == text, (
        "docs/errors.md is out of date with engine.core.errors: run `python tools/gen_errors_doc.py`"
    )


def test_event_reference_is_generated_from_the_payload_types() -> None:
    doc = REPO / "docs" / "concepts.md"
    text = doc.read_text(encoding="utf-8")
    assert _tool("gen_events_doc").regenerate(text) == text, (
        "docs/concepts.md's event reference is out of date with engine.core.payloads: "
        "run `python tools/gen_events_doc.py`"
    )


def test_providers_tables_are_generated_from_the_profiles() -> None:
    """The rung, escalation and thinking tables of docs/providers.md are the built-in profiles' own."""
    text = (REPO / "docs" / "providers.md").read_text(encoding="utf-8")
    assert _tool("gen_providers_doc").regenerate(text) == text, (
        "docs/providers.md's profile tables are out of date with engine.core.profiles: "
        "run `python tools/gen_providers_doc.py`"
    )


def test_the_refusals_of_each_operation_are_generated_from_the_openapi_document() -> None:
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    assert _tool("gen_api_doc").regenerate(text) == text, (
        "docs/api.md's refusals table is out of date with the routes' declarations: run `python tools/gen_api_doc.py`"
    )


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_examples_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'railyard.db'}"
    for name in ("RAILYARD_WORKFLOWS", "RAILYARD_ROLES_FILE", "PYTHONPATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAILYARD_DATABASE_URL", url)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    # The pages' commands run as in the repository's root: its reference workflows are the working directory's
    # `workflows` package (the RAILYARD_WORKFLOWS default), since installing Railyard does not add them.
    (tmp_path / "workflows").symlink_to(REPO / "workflows", target_is_directory=True)
    migrations.upgrade(url)

    assert RAILYARD.exists(), f"no railyard console script next to {sys.executable}"
    env = dict(os.environ)
    namespace: dict[str, Any] = {"__name__": f"docs_{path.stem.lower()}"}
    written: list[str] = []
    try:
        for block in blocks(path):
            if (target := block.option("file")) is not None:
                (tmp_path / target).write_text(block.text, encoding="utf-8")
                written.append(Path(target).stem)
            elif block.option("no-run") is not None:
                continue
            elif block.lang == "python":
                run_python(block, namespace)
            elif block.lang in ("console", "bash"):
                run_shell(block, env, tmp_path)
    finally:
        for value in namespace.values():
            if isinstance(value, Engine):
                value.close()
        for module in written:
            sys.modules.pop(module, None)


def test_providers_doc_shows_the_table_railyard_providers_prints() -> None:
    from engine.core.forcing import rung_table_markdown
    from engine.core.profiles import BUILTIN_PROFILES

    doc = (REPO / "docs" / "providers.md").read_text(encoding="utf-8")
    between = doc.split("<!-- providers:start -->\n", 1)[1].split("\n<!-- providers:end -->", 1)[0]
    assert between == rung_table_markdown({p.name: p for p in BUILTIN_PROFILES})


def test_not_marked_yet_is_current() -> None:
    """Every command exempted in NOT_MARKED_YET is still in its page, in a block that is not `no-run`."""
    present = {
        (block.path.name, command)
        for path in DOCS
        for block in blocks(path)
        if block.lang in ("console", "bash") and block.option("no-run") is None
        for _line, command in commands(block)
    }
    stale = sorted(set(NOT_MARKED_YET) - present)
    assert not stale, f"no longer in the docs (or marked no-run): delete from NOT_MARKED_YET: {stale}"


#: What docs/concepts.md leaves out of refund@1's diagram, so the business path can be read: the triggers
#: every agent or tool state has (cancel, limit, demote, and the tool protocol's call | reconcile self-loops)
#: and the generated sub-states (`S~force`, `S~provider_error`). The page says so under the diagram.
DIAGRAM_HIDDEN_TRIGGERS = frozenset({"cancel", "limit", "demote", "backoff", "call", "reconcile"})


def trimmed_diagram(mermaid: str) -> str:
    """`railyard graph` Mermaid output without styling, generated sub-states and the triggers every state has."""
    lines = mermaid.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "stateDiagram-v2")
    header = [*lines[: start + 1], *(line for line in lines if line.strip().startswith("direction "))]
    edges, used = [], set()
    for line in lines:
        ends, _, label = line.strip().partition(": ")
        if "-->" not in ends:
            continue
        source, _, target = (part.strip() for part in ends.partition("-->"))
        kept = [t for t in label.split(" | ") if t and t not in DIAGRAM_HIDDEN_TRIGGERS]
        if "~" in source or "~" in target or (label and not kept):
            continue
        edges.append(f"  {source} --> {target}" + (f": {' | '.join(kept)}" if kept else ""))
        used.update({source, target})
    states = [f'  state "{name}" as {name}' for name in _declared_order(mermaid) if name in used]
    return "\n".join([*header, *states, *edges]) + "\n"


def _declared_order(mermaid: str) -> list[str]:
    return [line.split()[-1] for line in mermaid.splitlines() if line.strip().startswith("state ")]


def test_concepts_shows_the_refund_diagram_railyard_graph_draws() -> None:
    """The diagram in docs/concepts.md is `railyard graph refund --version 1`, trimmed as the page says."""
    from workflows.refund import REFUND_V1

    [shown] = [b.text for b in blocks(REPO / "docs" / "concepts.md") if b.lang == "mermaid"]
    assert shown == trimmed_diagram(REFUND_V1.machine.graph("mermaid"))
