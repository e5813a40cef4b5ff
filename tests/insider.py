"""Edits made behind the engine's back, as an insider with write access to the database would make them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, create_engine, text


@contextmanager
def sql(url: str) -> Iterator[Connection]:
    """A plain connection in one transaction, outside the engine."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            yield conn
    finally:
        engine.dispose()


def tamper(url: str, statement: str, **params: object) -> None:
    """Run one statement behind the engine's back."""
    with sql(url) as conn:
        conn.execute(text(statement), params)
