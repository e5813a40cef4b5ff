"""Migrated SQLite files for the tests, by copy: the migrations run once per test process, into a template file,
and each database a test asks for is a copy of it (a copy takes well under a millisecond; running the migrations
takes about a tenth of a second, which over the suite's SQLite tests came to minutes)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from engine import migrations

_template: Path | None = None


def template() -> Path:
    """The migrated template of this process (of this xdist worker), made on first use, removed at exit."""
    global _template
    if _template is None:
        folder = Path(tempfile.mkdtemp(prefix="railyard-sqlite-template-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = folder / "template.db"
        migrations.upgrade(f"sqlite:///{path}")
        # The migrations closed their connections: the WAL was checkpointed into the file and removed.
        assert not path.with_name(path.name + "-wal").exists()
        _template = path
    return _template


def migrated_sqlite(path: Path) -> str:
    """A SQLite database at `path` (a new file), migrated to the head revision: its URL."""
    assert not path.exists(), f"{path} exists already"
    shutil.copyfile(template(), path)
    return f"sqlite:///{path}"
