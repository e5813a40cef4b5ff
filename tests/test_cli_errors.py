"""No traceback ever reaches a user: every command, driven with bad input, ends on one `CODE: message` line.

The commands are walked from the program itself (`engine.cli.app`, built from `COMMANDS`, `DB_COMMANDS` and the
sub-command groups), so a new command is in the matrix as soon as it is registered. Each is run with a bad flag,
with an argument that is not text, and with every bad database a user meets: mistyped URLs, a PostgreSQL server
that does not answer (127.0.0.1:1), a text file as the SQLite database, a folder that does not exist, a SQLite
file that does not exist, a database without the schema; then on a good database with task ids that do not
exist. A representative subset runs the real `railyard` executable in a subprocess.
"""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from engine import Code, migrations
from engine.audit.checkpoint import keygen
from engine.cli import COMMANDS, app
from tests.support.api import free_port

REPO = Path(__file__).resolve().parent.parent
RAILYARD = Path(sys.executable).parent / "railyard"
runner = CliRunner()
#: `CODE: message`, the one line a refusal prints.
REFUSAL = re.compile(r"^([A-Z][A-Z_]+): \S")
#: Commands that never open the database: a bad one is no concern of theirs.
NO_DATABASE = frozenset(
    {
        "workflows",
        "providers",
        "verify-export",
        "tokens new",
        "tokens hash",
        "tokens list",
        "checkpoint keygen",
        "eval run",
        "eval generate",
    }
)
#: Options beyond the required ones, so that the command gets as far as the database: a valid input, a task.
EXTRA = {
    "start": ["--input", '{"customer": "c1", "balance": 500}'],
    "graph": ["--task", str(uuid.uuid4())],
    "users tenants": ["--none"],
    "webhooks add": ["--kind", "task.ended"],
}
#: Commands that check the files they are given before they connect: bad files are refused first.
ARGUMENTS_FIRST = {"checkpoint verify": Code.CHECKPOINT_INVALID}
#: Commands that run until stopped when nothing is wrong: only run against a bad database.
LONG_RUNNING = frozenset({"worker", "serve", "demo"})
#: (command, database) pairs that succeed on it: creating and migrating a database is what `db upgrade` is for.
MAY_SUCCEED = frozenset(
    {
        ("db upgrade", "missing_file"),
        ("db upgrade", "unmigrated"),
        ("db current", "unmigrated"),
        ("db downgrade", "unmigrated"),
    }
)
#: (command, database) pairs on which the command starts and runs until stopped: a server whose database is not up
#: or not migrated yet serves anyway, /readyz answering 503 (`test_serve_says_why_its_database_is_not_ready`).
STARTS_ANYWAY = frozenset({("serve", "unreachable"), ("serve", "unmigrated")})
PASSWORD = "pg-s3cret"


def leaves(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command a user can run, by its words after `railyard`: the leaves, and the groups that run
    themselves (`railyard checkpoint`)."""
    children = getattr(command, "commands", None)
    if children is None:
        yield path, command
        return
    if path and getattr(command, "invoke_without_command", False):
        yield path, command
    for name, child in children.items():
        yield from leaves(child, (*path, name))


PROGRAM = typer.main.get_command(app)
ALL = dict(leaves(PROGRAM))


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    text = tmp_path / "notes.txt"
    text.write_text("this is not a database\n", encoding="utf-8")
    return {"text": text, "key": tmp_path / "signing.key"}


def argv_for(path: tuple[str, ...], command: Any, files: dict[str, Path]) -> list[str]:
    """The command with a plausible value for every argument and every required option."""
    values = {
        "task_id": str(uuid.uuid4()),
        "workflow": "refund",
        "trigger": "approve",
        "outcome": "executed",
        "revision": "head",
        "path": str(files["key"] if path == ("checkpoint", "keygen") else files["text"]),
        "older": str(files["text"]),
        "newer": str(files["text"]),
        "actor": "ann",
        "reason": "checking",
        "evidence": "ticket 1",
        "text": "a note",
        "to_version": "2",
        "state_map": "assessing=assessing",
        "before": "2020-01-01",
        "public_key": "00" * 32,
        "at_seq": "1",
        "to_state": "assessing",
        "name": "dana",
        "role": "auditor",
        "prefix": "abcdef12",
        "state": "assessing",
        "cases": str(files["text"]),
        "base": str(files["text"]),
        "out": str(files["text"].parent / "cases"),
        "model": f"scripted:{files['text']}",
        "url": "https://hooks.example.com/railyard",
        "subscription_id": "wh_0123456789abcdef",
        "message_ids": "msg_0123456789abcdef",
    }
    argv = list(path)
    for param in command.params:
        if param.param_type_name == "argument":
            assert param.name in values, f"railyard {' '.join(path)}: give the test a value for {param.name}"
            argv.append(values[param.name])
        elif param.required:
            assert param.name in values, f"railyard {' '.join(path)}: give the test a value for {param.opts[0]}"
            argv += [param.opts[0], values[param.name]]
    return argv + EXTRA.get(" ".join(path), [])


@dataclass(frozen=True)
class Database:
    name: str
    url: str
    code: Code


def bad_databases(tmp_path: Path, files: dict[str, Path]) -> list[Database]:
    unmigrated = tmp_path / "unmigrated.db"
    sqlite3.connect(unmigrated).execute("CREATE TABLE other (x INTEGER)").connection.close()
    return [
        Database("misspelt_scheme", f"postgersql+psycopg://postgres:{PASSWORD}@127.0.0.1/x", Code.DATABASE_URL_INVALID),
        Database("two_slashes", "sqlite://railyard.db", Code.DATABASE_URL_INVALID),
        Database("misspelt_sqlite", "sqllite:///railyard.db", Code.DATABASE_URL_INVALID),
        Database("bare_path", "railyard.db", Code.DATABASE_URL_INVALID),
        Database(
            "unreachable", f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:1/railyard", Code.DATABASE_UNREACHABLE
        ),
        Database("text_file", f"sqlite:///{files['text']}", Code.DATABASE_FILE_INVALID),
        Database("missing_folder", f"sqlite:///{tmp_path / 'no' / 'such' / 'railyard.db'}", Code.DATABASE_NOT_FOUND),
        Database("missing_file", f"sqlite:///{tmp_path / 'mistyped.db'}", Code.DATABASE_NOT_FOUND),
        Database("unmigrated", f"sqlite:///{unmigrated}", Code.SCHEMA_MISSING),
    ]


def invoke(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    result = runner.invoke(app, argv, env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), (argv, result.exception)
    return result.exit_code, result.stdout, result.stderr


def assert_one_line(argv: list[str], code: int, out: str, err: str) -> Code | None:
    """No traceback; a command that failed says why on one coded line (never UNEXPECTED_ERROR); the code."""
    shown = f"railyard {' '.join(argv)}: exit {code}\n--- stdout\n{out}--- stderr\n{err}"
    assert "Traceback" not in out + err, shown
    assert PASSWORD not in out + err, shown
    if code == 0:
        return None
    findings = {Code[word] for line in out.splitlines() for word in line.split() if word in Code.__members__}
    if code == 3 and findings and not err:  # audit findings: one line each on stdout, `WHERE  CODE  seq N  ...`
        return sorted(findings)[0]
    lines = err.strip().splitlines()
    assert len(lines) == 1, shown
    found = REFUSAL.match(lines[-1])
    assert found is not None, shown
    named = Code[found.group(1)]
    assert named is not Code.UNEXPECTED_ERROR, shown
    return named


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text("", encoding="utf-8")
    signer = tmp_path / "checkpoint.key"
    keygen(signer)
    monkeypatch.chdir(tmp_path)
    return {
        "RAILYARD_SIGNING_KEY": str(signer),
        "RAILYARD_WORKFLOWS": "tests.support.sample_workflows,workflows.expense",
        "RAILYARD_TOKENS_FILE": str(tokens),
        "RAILYARD_ARCHIVE_DIR": str(tmp_path / "archive"),
        "RAILYARD_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
    }


def test_the_matrix_covers_every_registered_command() -> None:
    words = {path[0] for path in ALL}
    assert {name for name, _ in COMMANDS} <= words
    assert {"db", "checkpoint", "tokens"} <= words
    assert ("db", "upgrade") in ALL and ("tokens", "new") in ALL and ("checkpoint",) in ALL


@pytest.mark.parametrize("path", sorted(ALL), ids=" ".join)
def test_a_command_on_every_bad_database_says_what_is_wrong_in_one_line(
    path: tuple[str, ...], env: dict[str, str], files: dict[str, Path], tmp_path: Path
) -> None:
    name = " ".join(path)
    argv = argv_for(path, ALL[path], files)
    for database in bad_databases(tmp_path, files):
        if (name, database.name) in STARTS_ANYWAY:
            continue
        code, out, err = invoke(argv, {**env, "RAILYARD_DATABASE_URL": database.url})
        named = assert_one_line(argv, code, out, err)
        if name in NO_DATABASE or (name, database.name) in MAY_SUCCEED:
            continue
        expected = {database.code, ARGUMENTS_FIRST.get(name, database.code)}
        assert code != 0 and named in expected, f"{name} on {database.name}: {named} (exit {code}) {err}"
        if database.name == "missing_file":  # read commands never create the file they were pointed at
            assert not (tmp_path / "mistyped.db").exists(), name


@pytest.mark.parametrize("path", sorted(ALL), ids=" ".join)
def test_a_command_with_a_bad_flag_or_undecodable_bytes_is_a_usage_error(
    path: tuple[str, ...], env: dict[str, str], files: dict[str, Path]
) -> None:
    argv = argv_for(path, ALL[path], files)
    undecodable = b"\xff\xfe".decode("utf-8", "surrogateescape")
    for bad in (
        [*argv, "--no-such-flag"],
        [*path, undecodable],
        [*argv[:-1], undecodable] if argv[len(path) :] else [],
    ):
        if not bad:
            continue
        code, out, err = invoke(bad, {**env, "RAILYARD_DATABASE_URL": "sqlite:///railyard.db"})
        assert assert_one_line(bad, code, out, err) is Code.USAGE_INVALID and code == 2, (bad, err)


@pytest.mark.parametrize("path", sorted(ALL), ids=" ".join)
def test_a_command_on_a_good_database_with_unknown_task_ids_refuses_with_a_code(
    path: tuple[str, ...], env: dict[str, str], files: dict[str, Path], tmp_path: Path
) -> None:
    if path[0] in LONG_RUNNING:
        pytest.skip(f"{path[0]} runs until stopped (or, the demo, for seconds) on a good database")
    url = f"sqlite:///{tmp_path / 'good.db'}"
    migrations.upgrade(url)
    argv = argv_for(path, ALL[path], files)
    code, out, err = invoke(argv, {**env, "RAILYARD_DATABASE_URL": url})
    named = assert_one_line(argv, code, out, err)
    if "task_id" in {p.name for p in ALL[path].params} and path != ("checkpoint", "verify"):
        assert named is Code.TASK_NOT_FOUND and code == 1, (argv, err)


@pytest.mark.parametrize("path", sorted(ALL), ids=" ".join)
def test_help_is_conventional(path: tuple[str, ...]) -> None:
    """`-h` as well as `--help`; arguments as TASK_ID, never `{task_id}`; flags without a `<bool>` value."""
    result = runner.invoke(app, [*path, "-h"])
    assert result.exit_code == 0, result.stderr
    usage = next(line for line in result.stdout.splitlines() if "Usage:" in line)
    assert "{" not in usage and "<bool>" not in result.stdout, result.stdout
    for param in ALL[path].params:
        if param.param_type_name == "argument":
            assert param.name.upper() in usage, usage


# -- the real executable ---------------------------------------------------------------------------------------------
def real(
    *args: str | bytes, url: str, cwd: Path, tty: bool = False, more: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """`railyard ARGS` as a shell runs it; with `tty`, its stdout is a terminal (a pseudo-terminal). `more`:
    variables beyond the database and the workflows."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILYARD_")}
    env |= {"RAILYARD_DATABASE_URL": url, "RAILYARD_WORKFLOWS": "workflows.expense", "PYTHONPATH": str(REPO)}
    env |= more or {}
    if not tty:
        done = subprocess.run(
            [str(RAILYARD), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=False
        )
        return done.returncode, done.stdout, done.stderr
    primary, secondary = pty.openpty()
    with subprocess.Popen(
        [str(RAILYARD), *args], env=env, cwd=cwd, stdout=secondary, stderr=subprocess.PIPE, text=True
    ) as process:
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        err = process.stderr.read() if process.stderr else ""
    os.close(primary)
    return process.returncode, b"".join(chunks).decode("utf-8").replace("\r\n", "\n"), err


@pytest.mark.parametrize(
    ("args", "url", "expected"),
    [
        (("status",), f"postgersql+psycopg://postgres:{PASSWORD}@127.0.0.1/x", Code.DATABASE_URL_INVALID),
        (("db", "upgrade"), f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:1/x", Code.DATABASE_UNREACHABLE),
        (("db", "current"), "sqlite://railyard.db", Code.DATABASE_URL_INVALID),
        (("replay", "--all"), "sqlite:///notes.txt", Code.DATABASE_FILE_INVALID),
        (("demo",), f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:1/x", Code.DATABASE_UNREACHABLE),
        (("worker", "--once"), "sqlite:///unmigrated.db", Code.SCHEMA_MISSING),
        (("show", "x"), "sqlite:///mistyped.db", Code.DATABASE_NOT_FOUND),
        (("show", b"\xff\xfe"), "sqlite:///railyard.db", Code.USAGE_INVALID),
        (("approve", "--no-such-flag"), "sqlite:///railyard.db", Code.USAGE_INVALID),
    ],
    ids=lambda v: v if isinstance(v, str) and "://" not in v else None,
)
def test_the_real_entry_point_prints_one_coded_line(
    args: tuple[str | bytes, ...], url: str, expected: Code, tmp_path: Path
) -> None:
    (tmp_path / "notes.txt").write_text("not a database\n", encoding="utf-8")
    sqlite3.connect(tmp_path / "unmigrated.db").close()
    code, out, err = real(*args, url=url, cwd=tmp_path)
    assert code == 2, err
    assert err.startswith(f"{expected}: ") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in out + err and PASSWORD not in out + err
    assert not (tmp_path / "mistyped.db").exists()


def test_the_postgresql_that_did_not_answer_is_named_without_its_password(tmp_path: Path) -> None:
    code, _, err = real("status", url=f"postgresql+psycopg://ops:{PASSWORD}@127.0.0.1:1/railyard", cwd=tmp_path)
    assert code == 2 and err.startswith("DATABASE_UNREACHABLE: PostgreSQL at 127.0.0.1:1 (database railyard, user ops)")
    assert "Connection refused" in err and PASSWORD not in err


def test_version_module_entry_point_and_tokens_print_no_warning(tmp_path: Path) -> None:
    code, out, err = real("--version", url="sqlite:///railyard.db", cwd=tmp_path)
    assert code == 0 and out.startswith("railyard ") and err == ""
    done = subprocess.run(
        [sys.executable, "-m", "engine.cli", "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout == out and done.stderr == ""
    code, out, err = real("tokens", "new", "--actor", "dana", "--role", "refund_approver", url="", cwd=tmp_path)
    assert code == 0 and err == "" and "Warning" not in out and 'actor = "dana"' in out


def test_piped_output_is_not_wrapped_at_80_columns(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'railyard.db'}"
    migrations.upgrade(url)
    code, out, _ = real("workflows", url=url, cwd=tmp_path)
    assert code == 0
    # The expense description is one line, not folded at Rich's default 80 columns.
    assert any("drafted by an agent and approved by a human." in line for line in out.splitlines()), out
    assert max(len(line) for line in out.splitlines()) > 80


@pytest.mark.parametrize(
    "args",
    [("workflows", "--json"), ("status", "--json"), ("replay", "--all", "--json"), ("db", "current", "--json")],
    ids=" ".join,
)
def test_every_json_output_is_one_document_indented_only_on_a_terminal(args: tuple[str, ...], tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'railyard.db'}"
    migrations.upgrade(url)
    code, piped, err = real(*args, url=url, cwd=tmp_path)
    assert code == 0, err
    assert piped.count("\n") == 1 and piped.endswith("\n"), piped  # one compact line
    code, shown, err = real(*args, url=url, cwd=tmp_path, tty=True)
    assert code == 0, err
    assert shown.count("\n") > 1 and shown.startswith(("{\n  ", "[\n  ")), shown  # indented by two
    assert json.loads(shown) == json.loads(piped)


def test_serve_says_why_its_database_is_not_ready_and_serves_anyway(tmp_path: Path) -> None:
    """PostgreSQL not up yet: one coded line on stderr naming it (no password), and /readyz answers 503."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text("", encoding="utf-8")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILYARD_")}
    env |= {
        "RAILYARD_DATABASE_URL": f"postgresql+psycopg://ops:{PASSWORD}@127.0.0.1:1/railyard",
        "RAILYARD_TOKENS_FILE": str(tokens),
        "RAILYARD_WORKFLOWS": "workflows.expense",
        "PYTHONPATH": str(REPO),
    }
    with subprocess.Popen(
        [str(RAILYARD), "serve", "--port", str(port)], env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True
    ) as server:
        try:
            assert server.stderr is not None
            first = server.stderr.readline()
            assert first.startswith("DATABASE_UNREACHABLE: PostgreSQL at 127.0.0.1:1 (database railyard, user ops)")
            assert "serving anyway" in first and PASSWORD not in first
            for _ in range(100):
                try:
                    answer = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            assert answer.status_code == 503 and PASSWORD not in answer.text
        finally:
            server.terminate()
            server.wait(timeout=30)


# -- refusals that say what is wrong --------------------------------------------------------------------------------
#: Two tasks whose ids start alike (the first 8 characters and more), and one of its own.
TWINS = ("b3678ff0-0000-4000-8000-000000000001", "b3678ff0-0000-4000-8000-000000000002")
SINGLE = "c0ffee00-0000-4000-8000-000000000003"


def started_with_ids(url: str, ids: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Refund tasks of the sample workflows on `url`, with the ids given (a UUID is random: these start alike)."""
    from engine import Engine, Registry, StaticRoles
    from tests.support.sample_workflows import ROLES, all_workflows

    queue = list(ids)
    with monkeypatch.context() as patched:
        patched.setattr(uuid, "uuid4", lambda: uuid.UUID(queue.pop(0)))
        with Engine(url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as engine:
            for _ in ids:
                engine.start("refund", {"customer": "c1", "balance": 500}, actor="ann")


TAKES_A_TASK = sorted(
    path for path, command in ALL.items() if "task_id" in {p.name for p in command.params} and path[0] != "checkpoint"
)


@pytest.mark.parametrize("path", TAKES_A_TASK, ids=" ".join)
def test_every_command_that_takes_a_task_id_refuses_a_prefix_of_two_tasks_ids_naming_both(
    path: tuple[str, ...], env: dict[str, str], files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'good.db'}"
    migrations.upgrade(url)
    started_with_ids(url, TWINS, monkeypatch)
    argv = argv_for(path, ALL[path], files)
    argv = [TWINS[0][:8] if _is_uuid(word) else word for word in argv]  # the task id, typed short
    assert TWINS[0][:8] in argv, argv
    code, out, err = invoke(argv, {**env, "RAILYARD_DATABASE_URL": url})
    assert assert_one_line(argv, code, out, err) is Code.TASK_ID_AMBIGUOUS and code == 1, (argv, err)
    assert TWINS[0] in err and TWINS[1] in err


def _is_uuid(word: str) -> bool:
    try:
        return str(uuid.UUID(word)) == word
    except ValueError:
        return False


def test_a_task_id_is_taken_by_its_first_8_characters_or_more_on_each_database(
    db_url: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    started_with_ids(db_url, (*TWINS, SINGLE), monkeypatch)
    env = {**env, "RAILYARD_DATABASE_URL": db_url}
    for typed in (SINGLE[:8], SINGLE[:13], SINGLE):
        code, out, err = invoke(["show", typed, "--json"], env)
        assert code == 0 and json.loads(out)["task_id"] == SINGLE, err
    code, out, err = invoke(["history", SINGLE[:20], "--json"], env)
    assert code == 0 and {e["task_id"] for e in json.loads(out)} == {SINGLE}, err
    code, out, err = invoke(["cancel", SINGLE[:8], "--as", "ann", "--reason", "typed short", "--json"], env)
    assert code == 0 and json.loads(out)["state"] == "cancelled", err
    code, out, err = invoke(["show", TWINS[0][:12]], env)
    assert code == 1 and err.startswith("TASK_ID_AMBIGUOUS: ") and TWINS[0] in err and TWINS[1] in err, err
    code, out, err = invoke(["show", SINGLE[:7]], env)  # 7 characters name no task, even where one starts so
    assert code == 1 and err.startswith("TASK_NOT_FOUND: "), err


def approval_waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, str], str, str]:
    """The reference refund waiting for approval of a prepared payment: the environment, the task id, the digest."""
    from engine import Engine, Registry, ScriptedModel, StaticRoles
    from workflows import fakes
    from workflows.scripts import REFUND_WRONG_ITEM_INPUT, refund_wrong_item

    url = f"sqlite:///{tmp_path / 'approvals.db'}"
    roles = tmp_path / "roles.toml"
    roles.write_text('[users]\ndana = ["refund_approver"]\n', encoding="utf-8")
    migrations.upgrade(url)
    fakes.bind(url)
    fakes.systems(url).reset()
    with Engine(url, Registry.from_modules(["workflows"]), authoriser=StaticRoles({})) as eng:
        task_id = eng.start("refund", REFUND_WRONG_ITEM_INPUT, actor="portal")
        eng.run(task_id, model=ScriptedModel(refund_wrong_item(eng.get(task_id).version)))
        prepared = eng.load(task_id).prepared
        assert prepared is not None
    env = {"RAILYARD_DATABASE_URL": url, "RAILYARD_WORKFLOWS": "workflows", "RAILYARD_ROLES_FILE": str(roles)}
    return env, task_id, str(prepared["digest"])


def test_a_digest_that_is_not_hex_is_digest_invalid_not_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from workflows import fakes

    env, task_id, digest = approval_waiting(tmp_path, monkeypatch)
    try:
        for named in ("z" * 12, digest[:11] + "-", " " + digest, "zz"):
            code, out, err = invoke(["approve", task_id, "--as", "dana", "--digest", named], env)
            assert code == 1 and out == "" and err.startswith("DIGEST_INVALID: ") and err.count("\n") == 1, err
        code, _, err = invoke(["approve", task_id, "--as", "dana", "--digest", "0" * 12], env)  # hex, not the call's
        assert code == 1 and err.startswith("APPROVAL_STALE: "), err
        code, out, err = invoke(["approve", task_id[:8], "--as", "dana", "--digest", digest[:12], "--json"], env)
        assert code == 0 and json.loads(out)["task_id"] == task_id, err
    finally:
        fakes.bind(None)


def test_verify_export_on_a_file_that_is_not_an_export_is_export_invalid_exit_2(
    tmp_path: Path, env: dict[str, str]
) -> None:
    url = f"sqlite:///{tmp_path / 'good.db'}"
    migrations.upgrade(url)
    env = {**env, "RAILYARD_DATABASE_URL": url}
    code, _, err = invoke(["start", "refund", "--as", "ann", "--input", '{"customer": "c1", "balance": 500}'], env)
    assert code == 0, err
    code, exported, err = invoke(["export", "--all"], env)
    assert code == 0, err
    not_exports = {
        "empty.jsonl": "",
        "notes.txt": "this is not an export\nnor is this\n",
        "other.json": '{"kind": "checkpoint", "root": "00"}\n[1, 2, 3]\n',
        "binary.bin": "\x00\x01\x02\n",
    }
    for name, content in not_exports.items():
        (tmp_path / name).write_text(content, encoding="utf-8")
        code, out, err = invoke(["verify-export", str(tmp_path / name)], env)
        assert code == 2 and out == "" and err.startswith("EXPORT_INVALID: ") and name in err, (name, err)
    # An export with a line changed is still an export: its finding says so, exit 3.
    edited = exported.replace('"balance":500', '"balance":900')
    assert edited != exported
    (tmp_path / "edited.jsonl").write_text(edited, encoding="utf-8")
    code, out, err = invoke(["verify-export", str(tmp_path / "edited.jsonl")], env)
    assert code == 3 and "HASH_MISMATCH" in out, out + err
    (tmp_path / "good.jsonl").write_text(exported, encoding="utf-8")
    assert invoke(["verify-export", str(tmp_path / "good.jsonl")], env)[0] == 0


def read_only_databases(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A migrated SQLite database, opened read-only as a URL says (`mode=ro`) and, where the file's mode binds this
    user (not root), as a file nobody may write; each with the text the refusal must name."""
    path = tmp_path / "kept.db"
    migrations.upgrade(f"sqlite:///{path}")
    yield f"sqlite:///file:{path}?mode=ro&uri=true", str(path)
    if os.geteuid() != 0:
        os.chmod(path, 0o444)
        os.chmod(tmp_path, 0o555)
        try:
            yield f"sqlite:///{path}", str(path)
        finally:
            os.chmod(tmp_path, 0o755)
            os.chmod(path, 0o644)


def test_a_read_only_sqlite_database_is_named_as_read_only_exit_2(tmp_path: Path, env: dict[str, str]) -> None:
    for url, named in read_only_databases(tmp_path):
        argv = ["start", "refund", "--as", "ann", "--input", '{"customer": "c1", "balance": 500}']
        code, out, err = invoke(argv, {**env, "RAILYARD_DATABASE_URL": url})
        assert assert_one_line(argv, code, out, err) is Code.DATABASE_READ_ONLY and code == 2, err
        assert named in err, err


def test_a_read_only_postgresql_database_is_named_as_read_only_exit_2(env: dict[str, str]) -> None:
    import psycopg

    from tests.support.postgres import create_pg_database, drop_pg_database, libpq

    url = create_pg_database()
    try:
        migrations.upgrade(url)
        name = url.rsplit("/", 1)[1]
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        argv = ["start", "refund", "--as", "ann", "--input", '{"customer": "c1", "balance": 500}']
        code, out, err = invoke(argv, {**env, "RAILYARD_DATABASE_URL": url})
        assert assert_one_line(argv, code, out, err) is Code.DATABASE_READ_ONLY and code == 2, err
        assert name in err, err
    finally:
        drop_pg_database(url)


# -- Ctrl-C and busy ports: the long-running commands -----------------------------------------------------------------
def sigint_handled_by_python(pid: int) -> bool | None:
    """Whether the process catches SIGINT (Python's own handler, installed as the interpreter starts); None once
    it is gone. Linux's /proc says it: bit 1 of SigCgt is SIGINT."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    except OSError:
        return None
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) & (1 << (signal.SIGINT - 1)))


def railyard_runs(pid: int) -> None:
    """Wait until Railyard's code runs in the process: the interpreter installed its SIGINT handler as it started,
    and `engine` took it away first thing."""
    seen, deadline = False, time.monotonic() + 30
    while time.monotonic() < deadline:
        caught = sigint_handled_by_python(pid)
        if caught is None or (seen and not caught):
            return
        seen = seen or caught
        time.sleep(0.001)
    pytest.fail("the process did not get as far as importing engine in 30 s")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads signal dispositions from Linux's /proc")
@pytest.mark.parametrize("command", ["demo", "worker", "serve", "run"])
def test_ctrl_c_at_any_moment_of_start_up_prints_no_traceback(command: str, tmp_path: Path) -> None:
    """SIGINT at random moments while a long-running command starts (importing `engine` alone takes about a second):
    the command ends (killed quietly while `engine` imports, or stopping in its own way after), and stderr has no
    traceback. The moments are counted from when Railyard's own code first runs: before that the interpreter is
    still starting (its `site`, the console script), where Python reports a SIGINT with a traceback of its own and
    no package can be first."""
    import random

    url = f"sqlite:///{tmp_path / 'railyard.db'}"
    migrations.upgrade(url)
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"turns": [{"text": "thinking"}] * 3}), encoding="utf-8")
    (tmp_path / "tokens.toml").write_text("", encoding="utf-8")
    task_id = ""
    if command == "run":
        from engine import Engine, Registry

        with Engine(url, Registry.from_modules(["workflows.expense"])) as engine:
            task_id = engine.start("expense", {"employee": "e-1", "limit_cents": 5000}, actor="ann")
    argv = {
        "demo": ["demo"],
        "worker": ["worker", "--model", f"scripted:{script}"],
        "serve": ["serve", "--port", str(free_port())],
        "run": ["run", task_id, "--model", f"scripted:{script}"],
    }[command]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAILYARD_", "OTEL_"))}
    env |= {
        "RAILYARD_DATABASE_URL": url,
        "RAILYARD_WORKFLOWS": "workflows.expense",
        "RAILYARD_TOKENS_FILE": str(tmp_path / "tokens.toml"),
        "PYTHONPATH": str(REPO),
    }
    moments = random.Random().sample([n / 20 for n in range(0, 40)], 6)  # 0 to 2 s after Railyard's code runs
    for moment in sorted(moments):
        with subprocess.Popen(
            [str(RAILYARD), *argv], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as process:
            railyard_runs(process.pid)
            time.sleep(moment)
            process.send_signal(signal.SIGINT)
            try:
                out, err = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
                pytest.fail(f"railyard {command}: still running 60 s after SIGINT at {moment} s\n{err}")
        shown = f"railyard {command}, SIGINT {moment} s in: exit {process.returncode}\n{err}"
        assert "Traceback" not in out + err and "Exception ignored" not in err, shown
        assert process.returncode in (0, 1, 2, 130, -signal.SIGINT), shown


def test_serve_on_a_busy_port_is_config_invalid_exit_2_in_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'railyard.db'}"
    migrations.upgrade(url)
    (tmp_path / "tokens.toml").write_text("", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILYARD_")}
    env |= {
        "RAILYARD_DATABASE_URL": url,
        "RAILYARD_TOKENS_FILE": str(tmp_path / "tokens.toml"),
        "RAILYARD_WORKFLOWS": "workflows.expense",
        "PYTHONPATH": str(REPO),
    }
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            [str(RAILYARD), "serve", "--port", str(port)], env=env, capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.startswith(f"CONFIG_INVALID: cannot serve on 127.0.0.1:{port}: ") and "in use" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # no uvicorn lines before or after it


# -- JSON input from a file or stdin ----------------------------------------------------------------------------------
def test_json_input_is_taken_from_a_file_or_stdin_on_each_command_that_takes_it(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """`--input` and `--payload` (and `--extra-body`) take `@FILE` and `-`: a 1 MB customer id, too long for an
    argument list, starts a task; a file that is not there, or not a JSON object, is USAGE_INVALID naming it."""
    url = f"sqlite:///{tmp_path / 'good.db'}"
    migrations.upgrade(url)
    env = {**env, "RAILYARD_DATABASE_URL": url}
    big = "c" * 1_000_000
    (tmp_path / "input.json").write_text(json.dumps({"customer": big, "balance": 500}), encoding="utf-8")
    code, out, err = invoke(["start", "refund", "--as", "ann", "--input", f"@{tmp_path / 'input.json'}", "--json"], env)
    assert code == 0, err
    task_id = json.loads(out)["task_id"]
    code, out, err = invoke(["history", task_id, "--json"], env)
    assert json.loads(out)[0]["data"]["input"]["customer"] == big, err
    result = runner.invoke(
        app,
        ["start", "refund", "--as", "ann", "--input", "-", "--json"],
        input='{"customer": "c2", "balance": 1}',
        env=env,
    )
    assert result.exit_code == 0, result.stderr
    second = json.loads(result.stdout)["task_id"]
    result = runner.invoke(
        app, ["fire", second, "note", "--as", "m", "--payload", "-", "--json"], input='{"note": "from stdin"}', env=env
    )
    assert result.exit_code == 0 and json.loads(result.stdout)["seq"] == 2, result.stderr
    (tmp_path / "list.json").write_text("[1, 2]", encoding="utf-8")
    for given, says in (
        (f"@{tmp_path / 'missing.json'}", "cannot read"),
        (f"@{tmp_path / 'list.json'}", "must be a JSON object"),
        (f"@{tmp_path}", "cannot read"),
    ):
        argv = ["start", "refund", "--as", "ann", "--input", given]
        code, out, err = invoke(argv, env)
        assert assert_one_line(argv, code, out, err) is Code.USAGE_INVALID and code == 2 and says in err, err
    argv = ["run", task_id, "--model", "scripted:x.json", "--extra-body", f"@{tmp_path / 'missing.json'}"]
    code, out, err = invoke(argv, env)
    assert assert_one_line(argv, code, out, err) is Code.USAGE_INVALID and "--extra-body" in err, err


# -- worker --once, for cron ------------------------------------------------------------------------------------------
def test_worker_once_drains_every_due_task_up_to_max_tasks_and_exits_0(
    db_url: str, env: dict[str, str], tmp_path: Path
) -> None:
    """Six due tasks and a concurrency of 2: `--once` advances all six (not one batch of 2), `--max-tasks 3` three."""
    from engine import Engine, Registry
    from tests.support.sample_workflows import all_workflows

    script = tmp_path / "model.json"
    give_up = {"tool_calls": [{"name": "give_up", "arguments": {}}]}
    script.write_text(json.dumps({"turns": [give_up] * 20}), encoding="utf-8")
    env = {**env, "RAILYARD_DATABASE_URL": db_url}
    with Engine(db_url, Registry(all_workflows())) as engine:
        first = [engine.start("refund", {"customer": "c1", "balance": 500}, actor="ann") for _ in range(6)]
        argv = ["worker", "--once", "--concurrency", "2", "--workflows", "refund", "--model", f"scripted:{script}"]
        code, out, err = invoke(argv, env)
        assert code == 0, err
        assert {engine.get(t).state for t in first} == {"rejected"}, err
        more = [engine.start("refund", {"customer": "c1", "balance": 500}, actor="ann") for _ in range(6)]
        code, out, err = invoke([*argv, "--max-tasks", "3"], env)
        assert code == 0, err
        assert sorted(engine.get(t).state for t in more) == ["assessing"] * 3 + ["rejected"] * 3, err
        code, out, err = invoke(argv, env)
        assert code == 0 and {engine.get(t).state for t in more} == {"rejected"}, err
    code, out, err = invoke(["worker", "--max-tasks", "3"], env)
    assert assert_one_line(["worker"], code, out, err) is Code.USAGE_INVALID and "--once" in err, err


# -- ids that can be copied, output that is not cut -------------------------------------------------------------------
def test_approvals_in_an_80_column_terminal_shows_ids_as_the_commands_take_them_on_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task id folded over 4 lines and a digest over 2 could not be copied: the table shows the first 8 and 12
    characters (what `approve` takes), whole; --wide adds them whole, --json has them whole."""
    from workflows import fakes

    env, task_id, digest = approval_waiting(tmp_path, monkeypatch)
    fakes.bind(None)
    url = env.pop("RAILYARD_DATABASE_URL")
    more = {**env, "COLUMNS": "80", "LINES": "40"}
    code, shown, err = real("approvals", url=url, cwd=tmp_path, tty=True, more=more)
    assert code == 0, err
    shown = re.sub(r"\x1b\[[0-9;]*m", "", shown)  # the terminal's colours
    assert max(len(line) for line in shown.splitlines()) <= 80, shown
    assert any(task_id[:8] in line and digest[:12] in line for line in shown.splitlines()), shown
    assert task_id[9:18] not in shown and digest[12:24] not in shown  # no id folded onto the next lines
    code, piped, err = real("approvals", "--wide", url=url, cwd=tmp_path, more=more)
    assert code == 0 and any(task_id in line and digest in line for line in piped.splitlines()), piped + err
    code, piped, err = real("approvals", "--json", url=url, cwd=tmp_path, more=more)
    assert code == 0 and [(p["task_id"], p["digest"]) for p in json.loads(piped)] == [(task_id, digest)], err
    code, out, err = real(
        "approve", task_id[:8], "--as", "dana", "--digest", digest[:12], "--json", url=url, cwd=tmp_path, more=more
    )
    assert code == 0 and json.loads(out)["task_id"] == task_id, err


@pytest.mark.parametrize("path", sorted(ALL), ids=" ".join)
def test_help_to_a_pipe_is_not_cut_at_80_columns(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0 and "…" not in result.stdout, result.stdout
    for param in ALL[path].params:
        if getattr(param, "hidden", False):  # not for people: `worker --supervised`, what a supervisor passes
            continue
        for opt in getattr(param, "opts", ()):
            if opt.startswith("--"):
                assert opt in result.stdout, (opt, result.stdout)


def test_the_real_help_to_a_pipe_names_every_option_whole(tmp_path: Path) -> None:
    code, out, err = real("worker", "--help", url="sqlite:///railyard.db", cwd=tmp_path)
    assert code == 0 and "--checkpoint-minutes" in out and "…" not in out, out + err
    assert max(len(line) for line in out.splitlines()) > 80
