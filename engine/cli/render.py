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
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from engine.core.canonical import format_instant
from engine.core.errors import RailyardError

# Every command imports this module, `railyard --help` too: what else it uses from the engine (pydantic,
# SQLAlchemy and the runtime behind it) is imported in the functions that print it.
if TYPE_CHECKING:
    from engine.audit.archive import ArchiveRun
    from engine.audit.checkpoint import Taken
    from engine.audit.export import ExportCheck
    from engine.core.chain import Finding
    from engine.core.checkpoints import Header
    from engine.core.events import Event
    from engine.core.replay import ReplayReport
    from engine.runtime.engine import TaskView

if TYPE_CHECKING:
    from engine.core.quality import Quality
    from engine.runtime.evals import CaseResult

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
    due = f", next model call at {view.next_try_at}" if view.next_try_at else ""
    out.print(f"{view.task_id}: {view.state} (seq {view.seq}, {view.status}{due})")


def quota_place(place: Mapping[str, Any]) -> str:
    """A task's place in the queue for quota, for people: `openai:gpt-4.1: next of 3 (priority 0), since ...`."""
    where = "next" if place["position"] == 0 else f"{place['position']} ahead of it"
    return (
        f"{place['quota']}: {where}, {place['waiting']} waiting (priority {place['priority']}); "
        f"since {place['since']}, looks again at {place['looks_again_at']}"
    )


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
    from engine.core.summary import compact

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
    if view.next_try_at is not None:
        table.add_row("next model call", f"{view.next_try_at} (after a provider error; any worker makes it)")
    if view.waiting_for_quota is not None:
        table.add_row("waiting for quota", quota_place(view.waiting_for_quota))
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
    if view.parent is not None:
        p = view.parent
        table.add_row("parent", Text(f"{p['task_id']} ({p['workflow']}, state {p['state']}, intent at seq {p['seq']})"))
    for child in view.children:
        ended = child["ended"]
        end = f", ended {ended['state']} (result {compact(ended['result'])})" if ended is not None else ""
        table.add_row(
            "child",
            Text(f"{child['task_id']} ({child['workflow']}, from {child['state_of_parent']}): {child['state']}{end}"),
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
    from engine.core.payloads import event_code
    from engine.core.summary import summarise

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


def history(task_id: str, events: list[Event], as_json: bool, view: TaskView | None = None) -> None:
    """The timeline; then, for a task in a tree (`view`), the task that started it and those it started, with
    their states now (the JSON stays the list of events: `railyard show --json` has the tree)."""
    if as_json:
        print_json([e.to_dict() for e in events])
        return
    # Piped or redirected, the timeline is not cut to 80 columns: it is read in files and pagers.
    wide = out if out.is_terminal else Console(width=max(out.width, HISTORY_WIDTH))
    wide.print(history_table(events, title=f"history of {task_id}"))
    if view is not None:
        for line in tree_lines(view):
            wide.print(line, highlight=False, markup=False)


def tree_lines(view: TaskView) -> list[str]:
    """A task's place in its tree, one line each: its parent, then each child with its state and end."""
    lines = []
    if view.parent is not None:
        p = view.parent
        lines.append(f"started by {p['task_id']} ({p['workflow']}, in {p['state']}, intent at seq {p['seq']})")
    for child in view.children:
        ended = child["ended"]
        end = f", ended {ended['state']}" if ended is not None else ""
        lines.append(
            f"started {child['task_id']} ({child['workflow']}, from {child['state_of_parent']}): {child['state']}{end}"
        )
    return lines


def ran(view: TaskView, events: list[Event], as_json: bool) -> None:
    """`run`: each event the model turns appended, one line each, then where the task stands."""
    from engine.core.payloads import event_code
    from engine.core.summary import summarise

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


def status(
    workflows: list[dict[str, Any]],
    workers: list[dict[str, Any]],
    as_json: bool,
    flow: dict[str, list[dict[str, Any]]] | None = None,
) -> None:
    """Tasks per workflow, then the live workers (if any), then flow control's breakers, quotas and the tasks
    waiting for quota (if any)."""
    flow = flow or {"breakers": [], "quotas": [], "waiting": []}
    if as_json:
        print_json({"workflows": workflows, "workers": workers, **flow})
        return
    _status_tables(workflows, workers)
    _flow_tables(flow)


def _flow_tables(flow: dict[str, list[dict[str, Any]]]) -> None:
    """The breakers not closed (or that failed lately), every quota bucket, and the first tasks waiting for quota."""
    breakers = flow["breakers"]
    if breakers:
        rows: list[tuple[str, ...]] = [
            (
                b["model"],
                b["state"].replace("_", " "),
                str(b["failures_in_a_row"]),
                "" if b["open_for_seconds"] is None else f"{b['open_for_seconds']:.0f} s",
            )
            for b in breakers
        ]
        out.print(_table("Circuit breakers", ("model", "state", "failures in a row", "open for"), rows))
    if flow["quotas"]:
        rows = []
        for q in flow["quotas"]:
            left = q["left"]
            shown = ", ".join(f"{k.replace('_', ' ')} {v:.0f}" for k, v in left.items() if v is not None)
            paused = f"{q['paused_for_seconds']:.0f} s" if q["paused_for_seconds"] else ""
            rows.append((q["quota"], shown, str(q["in_flight"]), str(q["waiting"]), paused))
        out.print(_table("Quotas", ("quota", "left now", "in flight", "waiting", "paused for"), rows))
    waiting = [w for w in flow["waiting"] if w["position"] < 10]
    if waiting:
        rows = [
            (w["task_id"], "waiting for quota", w["quota"], str(w["position"]), str(w["priority"]), w["group"])
            for w in waiting
        ]
        out.print(_table("Waiting for quota", ("task", "status", "quota", "position", "priority", "group"), rows))


def _status_tables(workflows: list[dict[str, Any]], workers: list[dict[str, Any]]) -> None:
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

    def line(name: str, w: dict[str, Any]) -> tuple[str, ...]:
        p99 = w.get("claim_latency_p99_ms")
        return (
            name,
            f"{w['seen_seconds_ago']:.0f} s ago",
            str(w["claimed"]),
            str(w["transitions"]),
            str(w["conflicts"]),
            str(w["lease_losses"]),
            str(w["failures"]),
            "" if p99 is None else f"{p99:.0f} ms",
        )

    rows = []
    for w in workers:
        processes = w.get("processes")
        if processes is None:
            rows.append(line(w["name"], w))
            continue
        # A supervisor's processes: the sums (the slowest process's claim p99), then a line for each.
        restarts = f", {w['restarts']} restarts" if w["restarts"] else ""
        rows.append(line(f"{w['name']} ({len(processes)} processes{restarts})", w))
        rows.extend(line(f"  process {p['process']}, pid {p['pid']}", p) for p in processes)
    out.print(_table("Workers", columns, rows))


# -- approvals -------------------------------------------------------------------------------------
def approvals(pending: list[dict[str, Any]], as_json: bool, wide: bool = False) -> None:
    """The table shows each task id and digest by the prefix the commands take (`approve 1a2b3c4d --digest
    0c99c2817f45`), never folded over lines; `wide` shows them whole as well; JSON always whole."""
    from engine.core.approvals import DIGEST_PREFIX
    from engine.core.summary import compact
    from engine.runtime.task_ids import TASK_ID_PREFIX

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
    from engine.core.approvals import DIGEST_PREFIX

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
    from engine.core.summary import compact

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


# -- quality -----------------------------------------------------------------------------------------
def _share(part: int, whole: int) -> str:
    return f"{part}/{whole} ({part / whole:.0%})" if whole else "-"


def _counted(counts: Mapping[str, int], whole: int) -> str:
    """`amount_cents 14 (14%), reason 2 (2%)`: the most frequent first, each as a share of `whole`."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{name} {n} ({n / whole:.0%})" if whole else f"{name} {n}" for name, n in ranked) or "-"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.1f}s"
    if value < 7200:
        return f"{value / 60:.1f}m"
    return f"{value / 3600:.1f}h"


def quality(figures: Quality, as_json: bool) -> None:
    """`railyard quality`: the turn figures, then the time in each state. Shares are of the answered turns."""
    from engine.core.quality import percentile

    if as_json:
        print_json(figures.to_dict())
        return
    if not figures.turns and not figures.states:
        err.print("nothing in this period: no model turn, and no visit to a state that ended", highlight=False)
        return
    # The cost columns only where a profile priced a turn: most deployments set no prices.
    costed = any(f.cost for f in figures.turns.values())
    out.print(
        _table(
            "Model turns",
            (
                "workflow",
                "state",
                "model",
                "rung",
                "turns",
                "first try",
                "repairs/turn",
                "escalations",
                "parse",
                "schema failures by field",
                "domain rejections by guard",
                "hand-offs",
                "tokens in/out",
                *(("cost",) if costed else ()),
            ),
            (
                (
                    f"{key.workflow}@{key.version}",
                    key.state,
                    f"{key.provider}:{key.model}",
                    key.rung,
                    str(f.turns),
                    _share(f.first_try_accepted, f.first_tries),
                    f"{f.repairs_per_turn:.2f}" if f.repairs_per_turn is not None else "-",
                    str(f.escalations),
                    str(f.parse_failures),
                    _counted(f.schema_failures, f.answered),
                    _counted(f.domain_rejections, f.answered),
                    str(f.hand_offs),
                    f"{f.tokens['input_tokens']:,}/{f.tokens['output_tokens']:,}" if f.tokens else "-",
                    *((_cost(f.cost, f.unpriced),) if costed else ()),
                )
                for key, f in sorted(figures.turns.items())
            ),
        )
    )
    out.print(
        _table(
            "Time in state",
            ("workflow", "state", "visits", "p50", "p95", "tokens/visit", *(("cost/visit",) if costed else ())),
            (
                (
                    f"{key.workflow}@{key.version}",
                    key.state,
                    str(s.visits),
                    _seconds(percentile(s.seconds, 0.5)),
                    _seconds(percentile(s.seconds, 0.95)),
                    f"{s.tokens / s.visits:,.0f}" if s.tokens else "-",
                    *((_cost(s.cost_per_visit or 0.0, s.unpriced) if s.tokens else "-",) if costed else ()),
                )
                for key, s in sorted(figures.states.items())
            ),
        )
    )


def _cost(value: float, unpriced: int) -> str:
    """A cost to four places (a hundredth of a cent); `?` where a turn's model had no price."""
    return "?" if unpriced else f"{value:,.4f}"


def eval_results(
    results: Sequence[CaseResult], as_json: bool, baseline: Mapping[str, Mapping[str, Any]] | None = None
) -> None:
    """`railyard eval run`: a row per case and model (and version, when several ran), the models and versions of a
    case side by side; then each one's totals, beside the baseline's when there is one."""
    from engine.core.evals import baseline_for
    from engine.runtime.evals import totals, variant

    summed = totals(results)
    if as_json:
        print_json({"cases": [r.to_dict() for r in results], "models": summed})
        return
    out.print(
        _table(
            "Evaluation",
            (
                "case",
                "model",
                "action",
                "expected",
                "met",
                "turns (rung: code)",
                "repairs",
                "schema failures",
                "tokens",
            ),
            (
                (
                    r.name,
                    variant(r, results),
                    escape(f"error: {r.error}") if r.error else r.action or f"none ({r.ended_in})",
                    r.expected or ("first try" if r.expectation.first_try else "-"),
                    "-" if r.met is None else "yes" if r.met else escape("NO: " + "; ".join(r.unmet)),
                    ", ".join(f"{t['rung']}: {t['code'] or 'ok'}" for t in r.turns),
                    str(r.figures.repairs),
                    _counted(r.figures.schema_failures, r.figures.answered),
                    f"{sum(r.figures.tokens.values()):,}" if r.figures.tokens else "-",
                )
                for r in sorted(results, key=lambda r: (r.name, r.model, r.version))
            ),
        )
    )
    for name, total in summed.items():
        was = ""
        base = None if baseline is None else baseline_for(baseline, name)
        if base is not None:
            was = (
                f" (baseline: {base.get('met')} of {base.get('expected')} met, "
                f"{base.get('first_try_accepted')} of {base.get('cases')} at the first try)"
            )
        say(
            f"{name}: {total['met']} of {total['expected']} expectations met, {total['first_try_accepted']} of "
            f"{total['cases']} cases accepted at the first try, {total['repairs']} repairs{was}"
        )
