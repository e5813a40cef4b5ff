"""A property-based fuzz of the JSON API from its own OpenAPI document (schemathesis), on SQLite and PostgreSQL.

Whatever a client sends, within the schema or not, the server answers with a
status and body its document declares, and never with a server error (5xx).
The examples per operation stay modest so `make test` stays fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from engine import Engine, Registry
from tests.support.api import bearer, live_server, make_api_engine, make_app, to_approval, token_table

MAX_EXAMPLES = 30


def _document() -> dict[str, Any]:
    """The app's OpenAPI document; it does not depend on the database, so an engine that never connects will do."""
    with Engine("sqlite://", Registry([]), authoriser=token_table()) as engine:
        return make_app(engine).openapi()


schema = schemathesis.openapi.from_dict(_document())


@pytest.fixture
def base_url(db_url: str, tmp_path: Path) -> Iterator[str]:
    """A real server over a database that holds something to list, diagram and replay."""
    with make_api_engine(db_url, tmp_path) as engine, live_server(make_app(engine)) as url:
        to_approval(engine)
        engine.start("refund", {"customer": "c1", "balance": 500}, actor="ann")
        yield url


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture],
)
def test_no_request_makes_the_server_fail(case: Any, base_url: str) -> None:
    case.call_and_validate(
        base_url=base_url,
        headers=bearer("dana"),
        checks=[not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance],
        # Not a timing test: on a loaded 2-CPU machine schemathesis' default 10 s read timeout was met once.
        timeout=60,
    )
