"""The way into an engine's SQL store, for a test that reaches past the store's verbs into its tables."""

from __future__ import annotations

from engine import Engine
from engine.store import SqlStore


def sql_store(eng: Engine) -> SqlStore:
    """The engine's store, which this test needs to be a SQL one (it reads or edits the tables directly)."""
    assert isinstance(eng.store, SqlStore), f"this test needs a SQL store, not {type(eng.store).__name__}"
    return eng.store
