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

import sys
from collections.abc import Callable
from pathlib import Path

import docgen

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
        document = docgen.replace_section(document, f"<!-- {name}:start -->", f"<!-- {name}:end -->", render(profiles))
    return document


def main(argv: list[str] | None = None) -> int:
    return docgen.main(
        argv, doc=DOC, regenerate=regenerate, script="tools/gen_providers_doc.py", what="the profile tables"
    )


if __name__ == "__main__":
    sys.exit(main())
