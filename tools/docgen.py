"""What the doc generators share: replacing a generated section between its markers, and the command line
(`--check` to fail when the page is out of date, else rewrite it).

The generators are scripts (`python tools/gen_errors_doc.py`), so this is imported as a sibling module.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def replace_section(document: str, start: str, end: str, body: str) -> str:
    """`document` with what lies between the markers `start` and `end` replaced by `body`; LookupError if the
    page has no such section."""
    before, found, rest = document.partition(start)
    _, closed, after = rest.partition(end)
    if not found or not closed:
        raise LookupError(f"the page has no {start} ... {end} section")
    return f"{before}{start}\n{body}\n{end}{after}"


def main(argv: list[str] | None, *, doc: Path, regenerate: Callable[[str], str], script: str, what: str) -> int:
    """Rewrite `doc` as `regenerate` says it should be, or with --check only report whether it is (exit 1 if not).
    `script` is how to run the generator (for the message), `what` the part of the page it generates."""
    parser = argparse.ArgumentParser(description=f"Generate {what} of {doc.name}.")
    parser.add_argument("--check", action="store_true", help=f"only report whether {what} is up to date")
    parser.add_argument("path", nargs="?", type=Path, default=doc, help=f"the Markdown file (default: docs/{doc.name})")
    args = parser.parse_args(argv)
    current = args.path.read_text(encoding="utf-8") if args.path.exists() else ""
    try:
        updated = regenerate(current)
    except LookupError as exc:
        print(f"{args.path}: {exc}", file=sys.stderr)
        return 1
    if args.check:
        if updated != current:
            print(f"{args.path} is out of date: run python {script}", file=sys.stderr)
            return 1
        return 0
    if updated != current:
        args.path.write_text(updated, encoding="utf-8")
        print(f"updated {args.path}")
    return 0
