"""Everything the `railyard` command prints goes through here: the consoles, JSON, the tables and the lines.

Standard output carries the answer (a table, a line, or with `--json` one JSON
document); standard error carries refusals and notes, so a script reads one
and a person the other. Each kind of answer has one function that prints both
its forms. An event reads the same here as on the pages and in the logs: its
summary is `engine.core.summary.summarise`, its code `engine.core.payloads.event_code`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from engine.audit.archive import ArchiveRun
from engine.audit.checkpoint import Taken
from engine.audit.export import ExportCheck
from engine.core.approvals import DIGEST_PREFIX
from engine.core.canonical import format_instant
from engine.core.chain import Finding
from engine.core.checkpoints import Header
from engine.core.errors import RailyardError
from engine.core.events import Event
from engine.core.payloads import event_code
from engine.core.replay import ReplayReport
from engine.core.summary import compact, summarise
from engine.runtime.engine import TaskView
from engine.runtime.task_ids import TASK_ID_PREFIX

#: How wide `history` prints its table when the output is not a terminal.
HISTORY_WIDTH = 160

#: How wide tables are drawn when the output is not a terminal (a file, a pipe, a log): no terminal to fit.
PIPE_WIDTH = 240

# soft_wrap: a line is never cut into two (a demo step, a table's title), whatever the width; piped, tables get
# PIPE_WIDTH rather than Rich's 80 columns.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else PIPE_WIDTH)
# soft_wrap: a refusal stays on one line (`CODE: message`) however narrow the terminal, for scripts.
err = Console(stderr=True, soft_wrap=True)


# -- the plain forms -------------------------------------------------------------------------------
def say(text: str) -> None:
    """One line of the answer, on stdout."""
    out.print(text)


def note(text: str) -> None:
    """A line for the person at the terminal (what is being done, a worker's progress), on stderr."""
    err.print(text, highlight=False)


def refusal(error: RailyardError) -> None:
    """`CODE: message` on stderr, on one line."""
    err.print(f"[bold red]{error.code}[/]: {escape(error.message)}", highlight=False, markup=True)


def _json(value: Any, level: int = 0) -> str:
    """The one JSON style of every `--json`: indented for a person at a terminal, one compact line for a pipe.

    `level`: how deep the value sits in a document being streamed (its lines are indented that much more)."""
    if not sys.stdout.isatty():
        return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
    return json.dumps(value, indent=2, ensure_ascii=False, default=str).replace("\n", "\n" + "  " * level)


def print_json(value: Any) -> None:
    """One JSON document on stdout."""
    sys.stdout.write(_json(value) + "\n")


def _stream_json(key: str, items: Iterable[Any], rest: Callable[[], dict[str, Any]]) -> None:
    """`{key: [items...], **rest()}` written as the items arrive, in `_json`'s style: a run over a million tasks
    never holds them all. `rest` is asked once the items are done (the totals)."""
    tty = sys.stdout.isatty()
    pad = "\n    " if tty else ""
    sys.stdout.write(("{\n  " if tty else "{") + _json(key) + (": [" if tty else ":["))
    first = True
    for item in items:
        sys.stdout.write(("" if first else ",") + pad + _json(item, 2))
        sys.stdout.flush()
        first = False
    sys.stdout.write("\n  ]" if tty and not first else "]")
    for name, value in rest().items():
        sys.stdout.write((",\n  " if tty else ",") + _json(name) + (": " if tty else ":") + _json(value, 1))
    sys.stdout.write(("\n}" if tty else "}") + "\n")


def text(value: str) -> None:
    """Text printed as it is (a diagram's source): no markup, no wrapping."""
    sys.stdout.write(value + "\n")


def jsonl(lines: Iterable[str]) -> None:
    """Lines already encoded (an export), written to stdout as UTF-8 bytes."""
    sink = sys.stdout.buffer
    for line in lines:
        sink.write(line.encode("utf-8"))
    sink.flush()


def count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _when(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S")


def _table(title: str, columns: Iterable[str], rows: Iterable[Sequence[str]]) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    return table


# -- tasks -----------------------------------------------------------------------------------------
def task_line(view: TaskView) -> None:
    """`TASK: STATE (seq N, STATUS)`: where a task stands after a command."""
    out.print(f"{view.task_id}: {view.state} (seq {view.seq}, {view.status})")


def started(view: TaskView, as_json: bool) -> None:
    if as_json:
        print_json(view.to_dict())
    else:
        out.print(view.task_id)


def fired(view: TaskView, as_json: bool) -> None:
    """The task after a human command; a cancel that waits for a write in flight says so."""
    if as_json:
        print_json(view.to_dict())
        return
    task_line(view)
    if view.cancel_requested is not None and view.unsettled is not None:
        # Not applied yet, and not lost: say so, or a person who just cancelled sees the task still running.
        write = view.unsettled
        out.print(
            f"cancel requested by {view.cancel_requested['actor']}: it takes effect once the outcome of "
            f"{write['tool']} (action {write['action_id']}, {write['status']}) is on record",
            highlight=False,
        )


def task(view: TaskView, point: Event | None, as_json: bool, tokens: Mapping[str, int] | None = None) -> None:
    """`show`: where the task stands, or with `point` where it stood right after that event; `tokens`: what its
    model turns spent (`engine.core.budgets.token_totals`)."""
    if as_json:
        shown = view.to_dict()
        if tokens is not None:
            shown["tokens"] = dict(tokens)
        if point is not None:
            shown["as_of"] = {
                "seq": point.seq,
                "at": format_instant(point.at),
                "actor": point.actor,
                "trigger": point.trigger,
            }
        print_json(shown)
        return
    title = f"task {view.task_id}" + (f" as of seq {point.seq}" if point is not None else "")
    table = Table(show_header=False, title=title)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    if point is not None:
        table.add_row("as of", f"seq {point.seq}: {point.trigger} by {point.actor} at {_when(point.at)} UTC")
    table.add_row("workflow", f"{view.workflow}@{view.version}")
    if view.tenant is not None:
        table.add_row("tenant", view.tenant)
    table.add_row("state", f"{view.state} ({view.kind})")
    table.add_row("status", view.status)
    table.add_row("seq", str(view.seq))
    table.add_row("allowed", ", ".join(view.allowed) or "(none: terminal)")
    if view.unsettled is not None:
        u = view.unsettled
        table.add_row(
            "write open",
            f"{u['tool']} action {u['action_id']}: {u['status']} (recorded in "
            f"{u['state']}; the task cannot end until its outcome is settled)",
        )
    if view.cancel_requested is not None:
        c = view.cancel_requested
        table.add_row(
            "cancel requested",
            f"by {c['actor']} at seq {c['seq']} ({c['reason']}): takes effect when the write's outcome is recorded",
        )
    # Values as text, never Rich markup: a `[restricted]` or a customer's `[urgent]` is shown as written.
    table.add_row("input", Text(compact(view.input)))
    if point is not None:
        table.add_row("facts", Text(compact(view.facts)))
    if tokens is not None and tokens["turns"]:
        table.add_row("tokens", _tokens(tokens))
    out.print(table)


def _tokens(t: Mapping[str, int]) -> str:
    """`1,290 (1,234 in, 200 of them cached; 56 out, 10 reasoning) over 3 model turns`."""
    turns = count(t["turns"], "model turn")
    if not t["reported"]:
        return f"not reported by the provider ({turns})"
    parts = [f"{t['input_tokens']:,} in" + (f", {t['cached_tokens']:,} of them cached" if t["cached_tokens"] else "")]
    parts.append(
        f"{t['output_tokens']:,} out" + (f", {t['reasoning_tokens']:,} reasoning" if t["reasoning_tokens"] else "")
    )
    unreported = t["turns"] - t["reported"]
    tail = f" over {turns}" + (f" ({unreported} reported none)" if unreported else "")
    return f"{t['total_tokens']:,} ({'; '.join(parts)}){tail}"


def history_table(events: Iterable[Event], title: str | None = None) -> Table:
    """The timeline as a Rich table (seq, time, actor, from, trigger, to, code, a summary of the data)."""
    table = Table(title=title, show_lines=False)
    for column in ("seq", "at (UTC)", "actor", "from", "trigger", "to", "code", "data"):
        table.add_column(column, overflow="fold", no_wrap=column in ("seq", "at (UTC)", "trigger", "code"))
    for ev in events:
        table.add_row(
            str(ev.seq),
            _when(ev.at),
            ev.actor,
            ev.from_state or "",
            ev.trigger,
            ev.to_state,
            event_code(ev.data) or "",
            Text(summarise(ev, 60)),
        )
    return table


def history(task_id: str, events: list[Event], as_json: bool) -> None:
    if as_json:
        print_json([e.to_dict() for e in events])
        return
    # Piped or redirected, the timeline is not cut to 80 columns: it is read in files and pagers.
    wide = out if out.is_terminal else Console(width=max(out.width, HISTORY_WIDTH))
    wide.print(history_table(events, title=f"history of {task_id}"))


def ran(view: TaskView, events: list[Event], as_json: bool) -> None:
    """`run`: each event the model turns appended, one line each, then where the task stands."""
    if as_json:
        print_json({"task": view.to_dict(), "events": [e.to_dict() for e in events]})
        return
    for ev in events:
        code = event_code(ev.data)
        out.print(
            f"{ev.seq}  {ev.from_state} --{ev.trigger}--> {ev.to_state}  {summarise(ev, 80)}"
            + (f"  {code}" if code else ""),
            highlight=False,
            markup=False,
        )
    task_line(view)


def status(workflows: list[dict[str, Any]], workers: list[dict[str, Any]], as_json: bool) -> None:
    """Tasks per workflow, then the live workers (if any)."""
    if as_json:
        print_json({"workflows": workflows, "workers": workers})
        return
    out.print(
        _table(
            "Tasks",
            ("workflow", "runnable", "leased", "blocked", "terminal", "oldest runnable"),
            (
                (
                    r["workflow"],
                    str(r["runnable"]),
                    str(r["leased"]),
                    str(r["blocked"]),
                    str(r["terminal"]),
                    "" if r["oldest_runnable_seconds"] is None else f"{r['oldest_runnable_seconds']:.0f} s",
                )
                for r in workflows
            ),
        )
    )
    if not workers:
        return
    columns = ("worker", "seen", "claimed", "transitions", "conflicts", "lease losses", "failures", "claim p99")
    rows = []
    for w in workers:
        p99 = w.get("claim_latency_p99_ms")
        rows.append(
            (
                w["name"],
                f"{w['seen_seconds_ago']:.0f} s ago",
                str(w["claimed"]),
                str(w["transitions"]),
                str(w["conflicts"]),
                str(w["lease_losses"]),
                str(w["failures"]),
                "" if p99 is None else f"{p99:.0f} ms",
            )
        )
    out.print(_table("Workers", columns, rows))


# -- approvals -------------------------------------------------------------------------------------
def approvals(pending: list[dict[str, Any]], as_json: bool, wide: bool = False) -> None:
    """The table shows each task id and digest by the prefix the commands take (`approve 1a2b3c4d --digest
    0c99c2817f45`), never folded over lines; `wide` shows them whole as well; JSON always whole."""
    if as_json:
        print_json(pending)
        return
    table = Table(title="Pending approvals")
    for column in ("task", "workflow", "state", "role", "started by", "prepared call", "digest"):
        if column in ("task", "digest"):  # what is copied from here is never folded over lines
            table.add_column(column, no_wrap=True)
        else:
            table.add_column(column, overflow="fold")
    if wide:
        table.add_column("task id", no_wrap=True)
        table.add_column("whole digest", no_wrap=True)
    for p in pending:
        prepared = p["prepared"] or {}
        call = f"{prepared.get('tool')} {compact(prepared.get('arguments'))}" if prepared else ""
        row = [
            p["task_id"][:TASK_ID_PREFIX],
            p["workflow"],
            p["state"],
            p["role"],
            p["started_by"],
            Text(call),
            (p["digest"] or "")[:DIGEST_PREFIX],
        ]
        table.add_row(*row, *((p["task_id"], p["digest"] or "") if wide else ()))
    out.print(table)


def approved(prepared: Mapping[str, Any]) -> None:
    """`approve` without --digest names the prepared call it approved, on stderr."""
    note(f"approved prepared call {prepared['tool']} (digest {str(prepared['digest'])[:DIGEST_PREFIX]})")


# -- audit -----------------------------------------------------------------------------------------
def findings(report: ReplayReport) -> None:
    where = f"task {report.task_id}" if report.task_id else "the file"
    for f in report.findings:  # one line per finding, however narrow the terminal: scripts grep these
        out.print(f"{where}  {f.code}  seq {f.seq}  {f.message}", highlight=False, markup=False, soft_wrap=True)


def replayed(report: ReplayReport, as_json: bool) -> None:
    """One task's replay: its findings, one line each, then the count."""
    if as_json:
        print_json(report.to_dict())
        return
    if not report.ok:
        findings(report)
    outcome = "no findings" if report.ok else count(len(report.findings), "finding")
    out.print(f"task {report.task_id} ({report.workflow}): {count(report.events, 'event')}, {outcome}", highlight=False)


def audit_totals(
    reports: Iterable[ReplayReport],
    as_json: bool,
    verb: str,
    checkpoint: tuple[Path, Header, list[ReplayReport]] | None = None,
) -> bool:
    """Print each report with findings as it arrives, then the totals; True if any finding.

    `--json` streams one object: `reports` (only those with findings), then the counts,
    so a run over a million tasks never holds its reports in memory.

    `checkpoint` (file, header, the judgement): the database judged against a signed checkpoint after the
    replay; its reports come after the replay's, and the totals say what the checkpoint covered.
    """
    tasks = events = found = failed = 0
    replay_found = replay_failed = 0
    judged = checkpoint[2] if checkpoint is not None else []

    def failing() -> Iterator[ReplayReport]:
        """The reports with findings, counting as they pass: the replay's, then the checkpoint's."""
        nonlocal tasks, events, found, failed, replay_found, replay_failed
        for report in reports:
            if report.task_id:
                tasks += 1
                events += report.events
            if not report.ok:
                found, failed = found + len(report.findings), failed + 1
                yield report
        replay_found, replay_failed = found, failed
        for report in judged:
            found, failed = found + len(report.findings), failed + 1
            yield report

    if as_json:

        def totals() -> dict[str, Any]:
            counts: dict[str, Any] = {"tasks": tasks, "events": events, "findings": found}
            if checkpoint is not None:
                path, header, _ = checkpoint
                counts["checkpoint"] = {
                    "file": str(path),
                    "tree_size": header.tree_size,
                    "root": header.root,
                    "at": header.at,
                    "findings": found - replay_found,
                }
            return {**counts, "ok": found == 0}

        _stream_json("reports", (report.to_dict() for report in failing()), totals)
        return found > 0
    for report in failing():
        findings(report)
    outcome = (
        "no findings" if not replay_found else f"{count(replay_found, 'finding')} in {count(replay_failed, 'report')}"
    )
    out.print(f"{verb} {count(tasks, 'task')}, {count(events, 'event')}: {outcome}", highlight=False)
    if checkpoint is not None:
        path, header, _ = checkpoint
        extra = found - replay_found
        verdict = "no findings" if not extra else count(extra, "finding")
        out.print(
            f"checked against {path.name} ({count(header.tree_size, 'task')}, root {header.root[:16]}, "
            f"taken {header.at}): {verdict}",
            highlight=False,
            markup=False,
        )
    return found > 0


def checkpoint_written(taken: Taken, as_json: bool) -> None:
    header, path, unrecorded = taken
    if as_json:
        print_json({"file": str(path), **header.to_dict(), "recorded": unrecorded is None})
    else:
        # The file on stdout, like `start` prints the task id (`CHECKPOINT=$(railyard checkpoint)`); the rest on stderr.
        out.print(str(path), highlight=False, markup=False, soft_wrap=True)
        err.print(
            f"{count(header.tree_size, 'task')}, root {header.root}, taken {header.at}, key {header.key_id}",
            highlight=False,
            markup=False,
        )
    if unrecorded is not None:
        err.print(
            f"warning: the checkpoint stands (the file is the checkpoint), but the database has no note of it: "
            f"{unrecorded}",
            highlight=False,
            markup=False,
        )


def proofs_reached(against: ExportCheck) -> None:
    """What `verify-export`'s proof checks did not reach, said on stderr so the verdict on stdout stays the
    same document: proofs held to no signed root, tasks without a proof line."""
    if not against.anchored and against.proved:
        err.print(
            f"note: {count(against.proved, 'proof line')} checked against the roots they name only; "
            "add --checkpoint and --public-key to hold them to a signed checkpoint",
            highlight=False,
            markup=False,
        )
    elif against.anchored and against.uncovered:
        listed = (
            "the checkpoint does not list (no proof line)"
            if against.heads is not None
            else "without a proof line: from a checkpoint's header alone, whether it lists them cannot be told"
        )
        err.print(
            f"note: {count(against.uncovered, 'task')} of the export {listed}; their logs are proven, not anchored",
            highlight=False,
            markup=False,
        )


def checkpoint_verdict(found: list[Finding], older: Path, newer: Path, as_json: bool) -> None:
    if as_json:
        print_json(
            {"older": str(older), "newer": str(newer), "ok": not found, "findings": [f.to_dict() for f in found]}
        )
        return
    for f in found:
        out.print(f"checkpoint  {f.code}  seq {f.seq}  {f.message}", highlight=False, markup=False, soft_wrap=True)
    verdict = "extends it" if not found else f"does not extend it ({count(len(found), 'finding')})"
    out.print(f"{newer.name} against {older.name}: {verdict}", highlight=False, markup=False)


def archived(done: ArchiveRun, directory: str, as_json: bool) -> None:
    if as_json:
        print_json({"directory": directory, "files": done.files, "tasks": done.tasks, "events": done.events})
        return
    out.print(
        f"archived {count(done.tasks, 'task')} ({count(done.events, 'event')}) to "
        f"{count(len(done.files), 'file')} in {directory}" + "".join(f"\n  {name}" for name in done.files),
        highlight=False,
    )


# -- definitions and setup -------------------------------------------------------------------------
def workflows(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print_json(rows)
        return
    columns = ("workflow", "version", "states", "initial", "roles", "digest", "description")
    out.print(
        _table(
            "Workflows",
            columns,
            (
                (
                    r["workflow"],
                    str(r["version"]),
                    str(r["states"]),
                    r["initial"],
                    ", ".join(r["roles"]),
                    r["digest"][:12],
                    r["description"],
                )
                for r in rows
            ),
        )
    )
    if not rows:
        err.print("no workflows registered: set RAILYARD_WORKFLOWS to the modules that define them", highlight=False)


def tokens(rows: list[dict[str, Any]], as_json: bool) -> None:
    """The tokens of a tokens file and of the database (`railyard tokens list`): never a token, only the start of
    its hash."""
    if as_json:
        print_json(rows)
        return
    out.print(
        _table(
            "Tokens",
            ("source", "actor", "roles", "tenants", "expires", "sha256"),
            (
                (
                    r["source"],
                    r["actor"],
                    ", ".join(r["roles"]),
                    ", ".join(r["tenants"]) if r["tenants"] is not None else "any",
                    (r["expires"] or "never")
                    + (" (expired)" if r["expired"] else "")
                    + (f" (revoked {r['revoked']})" if r.get("revoked") else ""),
                    r["sha256"][:12],
                )
                for r in rows
            ),
        )
    )


def people(rows: list[dict[str, Any]], as_json: bool) -> None:
    """`railyard users list`: never a password or its hash, only whether there is one."""
    if as_json:
        print_json(rows)
        return
    out.print(
        _table(
            "People",
            ("name", "roles", "tenants", "source", "password", "disabled", "updated"),
            (
                (
                    r["name"],
                    ", ".join(r["roles"]),
                    ", ".join(r["tenants"]) if r["tenants"] is not None else "any",
                    r["source"],
                    "set" if r["password"] else "none",
                    "disabled" if r["disabled"] else "",
                    r["updated_at"] or "",
                )
                for r in rows
            ),
        )
    )


def access_trail(rows: list[dict[str, Any]], as_json: bool) -> None:
    """`railyard users trail`: who changed which person or token, when, and what."""
    if as_json:
        print_json(rows)
        return
    out.print(
        _table(
            "Access trail",
            ("id", "at", "by", "action", "subject", "details"),
            (
                (
                    str(r["id"]),
                    r["at"],
                    r["by"],
                    r["action"],
                    r["subject"],
                    json.dumps(r["details"], ensure_ascii=False, separators=(", ", ": ")) if r["details"] else "",
                )
                for r in rows
            ),
        )
    )


def providers(rows: list[dict[str, Any]], as_json: bool) -> None:
    """The capability profiles and their forcing rungs (several actions / one action)."""
    if as_json:
        print_json(rows)
        return
    columns = (
        "profile",
        "wire",
        "native schema",
        "tool_choice (thinking off)",
        "tool_choice (thinking on)",
        "rung, thinking off",
        "rung, thinking on",
    )
    out.print(
        _table(
            "Capability profiles (rung: several actions / one action)",
            columns,
            (
                (
                    r["name"],
                    r["wire"],
                    r["native_schema"],
                    ", ".join(r["tool_choice_thinking_off"]) or "(not sent)",
                    ", ".join(r["tool_choice_thinking_on"]) or "(not sent)",
                    f"{r['rung_thinking_off']} / {r['rung_thinking_off_one_action']}",
                    f"{r['rung_thinking_on']} / {r['rung_thinking_on_one_action']}",
                )
                for r in rows
            ),
        )
    )
    out.print(
        _table(
            "Escalation after an ignored rung (attempts of a model that ignores every one, several actions)",
            ("profile", "reminder role", "order (the last repeats)", "attempts, thinking off", "attempts, thinking on"),
            (
                (
                    r["name"],
                    r["reminder_role"],
                    ", ".join(r["escalation"]),
                    " → ".join(r["escalation_thinking_off"]),
                    " → ".join(r["escalation_thinking_on"]),
                )
                for r in rows
            ),
        )
    )
    if all("settings" in r for r in rows):
        _provider_settings(rows)


def _provider_settings(rows: list[dict[str, Any]]) -> None:
    """How a model of each profile is called here, and which layer set each value that is not the default."""

    def layers(r: dict[str, Any]) -> str:
        given = [f"{k} ({v.replace('_', ' ')})" for k, v in r["settings_from"].items() if v != "default"]
        return ", ".join(given) or "defaults"

    out.print(
        _table(
            "How models are called (options > RAILYARD_MODEL_* > profiles file > default)",
            ("profile", "timeout", "retries", "stream", "extra body", "set by"),
            (
                (
                    r["name"],
                    f"{r['settings']['timeout_seconds']:g} s",
                    str(r["settings"]["retries"]),
                    "on" if r["settings"]["stream"] else "off",
                    compact(r["settings"]["extra_body"]) if r["settings"]["extra_body"] else "",
                    layers(r),
                )
                for r in rows
            ),
        )
    )


def revision(revision: str | None, as_json: bool) -> None:
    """The schema revision a database is at."""
    if as_json:
        print_json({"revision": revision})
    else:
        out.print(revision or "base (empty)")
