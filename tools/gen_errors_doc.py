"""Regenerate the error-code table of docs/errors.md from `engine.errors`.

The table between `<!-- codes:start -->` and `<!-- codes:end -->` has one row
per member of `engine.errors.Code`, in enum order, with its text from
`engine.errors.CODE_REFERENCE`. Everything outside the markers is left alone.

    python tools/gen_errors_doc.py           # rewrite docs/errors.md in place
    python tools/gen_errors_doc.py --check   # exit 1 if the file is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.errors import CODE_REFERENCE, Code

START = "<!-- codes:start -->"
END = "<!-- codes:end -->"
DOC = Path(__file__).resolve().parent.parent / "docs" / "errors.md"


def render_table() -> str:
    """The Markdown table, one row per code in enum order."""
    missing = [str(code) for code in Code if code not in CODE_REFERENCE]
    if missing:
        raise LookupError(f"engine.errors.CODE_REFERENCE has no text for: {', '.join(missing)}")
    rows = ["| code | meaning |", "| --- | --- |"]
    for code in Code:
        text = " ".join(CODE_REFERENCE[code].split()).replace("|", "\\|")
        rows.append(f"| `{code}` | {text} |")
    return "\n".join(rows)


def regenerate(document: str) -> str:
    """`document` with the text between the markers replaced by the current table."""
    head, sep, rest = document.partition(START)
    if not sep or END not in rest:
        raise ValueError(f"the document must contain {START} followed by {END}")
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{render_table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the file is up to date")
    parser.add_argument("path", nargs="?", type=Path, default=DOC, help="the Markdown file (default: docs/errors.md)")
    args = parser.parse_args(argv)
    current = args.path.read_text(encoding="utf-8")
    try:
        updated = regenerate(current)
    except (LookupError, ValueError) as exc:
        print(f"{args.path}: {exc}", file=sys.stderr)
        return 1
    if args.check:
        if updated != current:
            print(f"{args.path} is out of date: run python tools/gen_errors_doc.py", file=sys.stderr)
            return 1
        return 0
    if updated != current:
        args.path.write_text(updated, encoding="utf-8")
        print(f"updated {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
