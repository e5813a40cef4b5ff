"""Every benchmark in one run, and every target they hold in one table (issue #33: "figures in one table").

Each benchmark prints its own table and ends with one JSON line whose `targets` list says, per target, the value,
the comparison, the threshold and whether it was met. This runs them one after the other (their output streams
through as it comes, so a long run shows where it is), keeps each one's JSON line, and prints one table of every
target with its benchmark, then one JSON line of them all. `--write FILE` replaces the block between the
`<!-- figures:start -->` and `<!-- figures:end -->` lines of FILE (docs/performance.md) with the table, dated and
with the machine, so the document's one table is always one run's.

    .venv/bin/python bench/figures.py [--quick] [--only append,quota] [--write docs/performance.md]

A benchmark that fails (a non-zero exit without a JSON line) is reported as such and the others still run; the
exit status is 1 if any benchmark failed to report, 0 otherwise (a target not met is a figure, not a failure).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: In the order `make bench` runs them: the quick ones first, the long quota run last.
BENCHES = (
    "replay",
    "append",
    "blinks",
    "agent_step",
    "workers",
    "checkpoint",
    "llm_bound",
    "scale",
    "cli_start",
    "backoffice",
    "quota",
)

START, END = "<!-- figures:start -->", "<!-- figures:end -->"


def last_report(lines: Iterable[str]) -> dict[str, Any] | None:
    """The benchmark's JSON line: the last line that parses as a JSON object with a `targets` list."""
    found = None
    for line in lines:
        text = line.strip()
        if not text.startswith("{"):
            continue
        try:
            parsed = json.loads(text)
        except ValueError:
            continue
        if isinstance(parsed, dict) and isinstance(parsed.get("targets"), list):
            found = parsed
    return found


def run_one(name: str, quick: bool) -> tuple[dict[str, Any] | None, int]:
    """Run `bench/NAME.py`, echoing its output line by line; its report (None: it printed none) and exit status."""
    argv = [sys.executable, str(HERE / f"{name}.py"), *(["--quick"] if quick else [])]
    print(f"\n=== {name}{' --quick' if quick else ''} ===", flush=True)
    lines: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()
        status = proc.wait()
    return last_report(lines), status


def rows(reports: dict[str, dict[str, Any] | None]) -> list[dict[str, Any]]:
    """One row per target, named by its benchmark; a benchmark with no report is one row saying so."""
    out: list[dict[str, Any]] = []
    for bench, report in reports.items():
        if report is None:
            out.append({"bench": bench, "name": "(no report: the benchmark failed)", "value": None, "op": "",
                        "threshold": None, "met": None, "note": ""})  # fmt: skip
            continue
        out.extend({"bench": bench, **t} for t in report["targets"])
    return out


def shown(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def verdict(met: bool | None) -> str:
    return {True: "met", False: "NOT MET", None: "not measured"}[met]


def text_table(table: Sequence[dict[str, Any]]) -> str:
    """The table for a terminal: verdict, benchmark, target, value against its threshold."""
    width = max((len(r["name"]) for r in table), default=0)
    lines = [f"{'verdict':<13} {'bench':<11} {'target':<{width}}  value"]
    for r in table:
        lines.append(
            f"{verdict(r['met']):<13} {r['bench']:<11} {r['name']:<{width}}  "
            f"{shown(r['value'])} {r['op']} {shown(r['threshold'])}"
        )
    met = sum(1 for r in table if r["met"] is True)
    lines.append(f"{met} of {len(table)} targets met")
    return "\n".join(lines)


def markdown_table(table: Sequence[dict[str, Any]], quick: bool, machine: dict[str, Any] | None, at: str) -> str:
    """The block `--write` puts in the document: when, where, how, and one row per target."""
    where = (
        f"{machine.get('nproc')} CPUs ({machine.get('cpu')}), Python {machine.get('python')}, "
        f"PostgreSQL {machine.get('postgresql')}, SQLite {machine.get('sqlite')}, commit {machine.get('commit')}"
        if machine
        else "machine not reported"
    )
    head = [
        START,
        f"Measured {at} by `bench/figures.py{' --quick' if quick else ''}` on {where}.",
        "",
        "| bench | target | value | threshold | verdict |",
        "| --- | --- | --- | --- | --- |",
    ]
    body = [
        f"| {r['bench']} | {r['name']} | {shown(r['value'])} | {r['op']} {shown(r['threshold'])} "
        f"| {verdict(r['met'])} |"
        for r in table
    ]
    return "\n".join([*head, *body, END])


def write_block(path: Path, block: str) -> None:
    """Replace the figures block of `path` (or add it at the end when the file has none)."""
    text = path.read_text(encoding="utf-8")
    if START in text and END in text:
        before, rest = text.split(START, 1)
        after = rest.split(END, 1)[1]
        text = before + block + after
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="each benchmark's --quick version")
    parser.add_argument("--only", default="", help="comma-separated benchmark names (default: all of them)")
    parser.add_argument("--write", type=Path, default=None, help="replace the figures block of this file")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHES)}")
    reports: dict[str, dict[str, Any] | None] = {}
    for name in names:
        reports[name], _status = run_one(name, args.quick)
    table = rows(reports)
    print("\n=== every target, one run ===")
    print(text_table(table))
    machine = next((r["machine"] for r in reports.values() if r is not None and "machine" in r), None)
    at = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    if args.write is not None:
        write_block(args.write, markdown_table(table, args.quick, machine, at))
        print(f"wrote the table to {args.write}")
    met = [r["met"] for r in table]
    print(json.dumps({"bench": "figures", "quick": args.quick, "at": at, "machine": machine, "targets": table,
                      "all_met": all(m is True for m in met)}))  # fmt: skip
    return 1 if any(r is None for r in reports.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
