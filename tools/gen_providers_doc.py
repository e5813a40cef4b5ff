"""Generate the profile tables in docs/providers.md from the built-in capability profiles.

Three sections of the page are generated from `engine.core.profiles.BUILTIN_PROFILES`
through `engine.core.forcing`, each between its markers: the rungs each profile gets
(`providers`, the table `railyard providers` prints), the escalation order and what it
makes of a model that ignores every rung (`escalation`), and the thinking switches
(`thinking`). The rest of the page is left as it is.

    python tools/gen_providers_doc.py           # rewrite the sections of docs/providers.md
    python tools/gen_providers_doc.py --check   # exit 1 if one is out of date
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from engine.core.forcing import escalation_table_markdown, rung_table_markdown, thinking_table_markdown
from engine.core.profiles import BUILTIN_PROFILES, CapabilityProfile

DOC = Path(__file__).resolve().parent.parent / "docs" / "providers.md"

#: Each section's marker name and the table that fills it.
SECTIONS: dict[str, Callable[[dict[str, CapabilityProfile]], str]] = {
    "providers": rung_table_markdown,
    "escalation": escalation_table_markdown,
    "thinking": thinking_table_markdown,
}


def regenerate(document: str) -> str:
    """`document` with every generated section replaced by what the built-in profiles say."""
    profiles = {p.name: p for p in BUILTIN_PROFILES}
    for name, render in SECTIONS.items():
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        before, found, rest = document.partition(start)
        _, closed, after = rest.partition(end)
        if not found or not closed:
            raise LookupError(f"the page has no {start} ... {end} section")
        document = f"{before}{start}\n{render(profiles)}\n{end}{after}"
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the sections are up to date")
    parser.add_argument(
        "path", nargs="?", type=Path, default=DOC, help="the Markdown file (default: docs/providers.md)"
    )
    args = parser.parse_args(argv)
    current = args.path.read_text(encoding="utf-8")
    try:
        updated = regenerate(current)
    except LookupError as exc:
        print(f"{args.path}: {exc}", file=sys.stderr)
        return 1
    if args.check:
        if updated != current:
            print(f"{args.path} is out of date: run python tools/gen_providers_doc.py", file=sys.stderr)
            return 1
        return 0
    if updated != current:
        args.path.write_text(updated, encoding="utf-8")
        print(f"updated {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
