"""Generate the table of docs/api.md that says what each operation of the API can refuse with, from the app's own
OpenAPI document (each route's `responses`, declared once at the route with `engine.api.schemas.refusals`).

    python tools/gen_api_doc.py           # rewrite that section of docs/api.md
    python tools/gen_api_doc.py --check   # exit 1 if it is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import docgen

from engine import Engine, Registry
from engine.api import TokenTable, create_app

START = "<!-- refusals:start -->"
END = "<!-- refusals:end -->"
DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def document() -> dict[str, Any]:
    """The OpenAPI document; it does not depend on the database or the workflows, so an empty engine will do."""
    with Engine("sqlite://", Registry([]), authoriser=TokenTable.from_tokens({})) as engine:
        return create_app(engine, TokenTable.from_tokens({}), session_secret="docs").openapi()


def table(doc: dict[str, Any]) -> str:
    """One row per operation, in the document's order: its id, method and path, and per error status its codes.
    Every operation also answers 401 ACTOR_REQUIRED, 422 PAYLOAD_INVALID and 500 INTERNAL_ERROR, and every one
    that reads the database 503 with the database's codes: said once above the table, left out of the rows
    (a 503 stands alone)."""
    everywhere = {(401, "ACTOR_REQUIRED"), (422, "PAYLOAD_INVALID"), (500, "INTERNAL_ERROR")}
    rows = ["| operation | method and path | refusals (status: codes) |", "| --- | --- | --- |"]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            cells = []
            for status, response in sorted(op["responses"].items(), key=lambda kv: int(kv[0])):
                if int(status) < 400:
                    continue
                codes = response["content"]["application/json"]["schema"]["properties"]["code"]["enum"]
                kept = [c for c in codes if (int(status), c) not in everywhere]
                if status == "503":
                    cells.append("503")
                elif kept:
                    cells.append(f"{status}: " + ", ".join(f"`{c}`" for c in kept))
            rows.append(f"| `{op['operationId']}` | `{method.upper()} {path}` | {'; '.join(cells) or '(only those)'} |")
    return "\n".join(rows)


def regenerate(text: str) -> str:
    return docgen.replace_section(text, START, END, table(document()))


def main(argv: list[str] | None = None) -> int:
    return docgen.main(
        argv, doc=DOC, regenerate=regenerate, script="tools/gen_api_doc.py", what="the refusals of each operation"
    )


if __name__ == "__main__":
    sys.exit(main())
