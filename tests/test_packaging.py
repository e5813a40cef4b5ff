"""What installing Railyard puts on the import path, met the way a user meets it.

A wheel is built from this repository and installed on its own, then run from folders of the user's own:
installing adds the one top-level name `engine`. Railyard's migrations ship inside it and are found there, so a
user's `migrations/` folder is never what `railyard db upgrade` runs; the reference workflows stay in the
repository, so a process with no `workflows` package of its own has an empty registry and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from engine import migrations

REPO = Path(__file__).resolve().parent.parent
#: What setuptools reads to build the wheel; `workflows/` is among them, so the wheel shows it is left out.
SOURCES = ("pyproject.toml", "README.md", "engine", "migrations", "workflows")
#: A workflow of the user's own: the reference `expense@1`, renamed.
OWN_WORKFLOW = (REPO / "workflows" / "expense.py").read_text(encoding="utf-8").replace('name="expense"', 'name="own"')


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("wheel")
    source = build / "source"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    # -v: the build backend's own output (its warnings) is what `make venv` prints; kept beside the wheel.
    pip = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation"]
    done = subprocess.run(
        [*pip, "--wheel-dir", str(build / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    [built] = (build / "dist").glob("railyard-*.whl")
    built.with_suffix(".log").write_text(done.stdout + done.stderr, encoding="utf-8")
    return built


def test_the_build_finds_every_package_of_its_own(wheel: Path) -> None:
    """No setuptools warning that a folder of `engine` (the pages' templates, their static files) is missing from
    the packages list, and every file under engine/ is in the wheel."""
    log = wheel.with_suffix(".log").read_text(encoding="utf-8")
    assert "absent from the `packages` configuration" not in log
    with zipfile.ZipFile(wheel) as built:
        names = set(built.namelist())
    mine = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "engine").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert mine <= names, sorted(mine - names)


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel installed into a folder of its own (its dependencies are the test environment's)."""
    target = tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    done = subprocess.run(
        [*pip, "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return target


def python(cwd: Path, *args: str, site: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """This Python in `cwd`, with the installed wheel first on its path when `site` is given."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RAILYARD_") and k != "PYTHONPATH"}
    if site is not None:
        environ["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env={**environ, **env}, capture_output=True, text=True, timeout=120
    )


def railyard(site: Path, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The installed wheel's `railyard` (its console script's entry point), run in `cwd`."""
    main = "import sys; from engine.cli import main; sys.argv[0] = 'railyard'; main()"
    return python(cwd, "-c", main, *args, site=site, **env)


def users_folder(root: Path) -> Path:
    """A project of the user's own: a `migrations/` that must never run, and a `workflows` package."""
    (root / "migrations" / "versions").mkdir(parents=True)
    (root / "migrations" / "__init__.py").write_text("")
    (root / "migrations" / "env.py").write_text("raise SystemExit('the user migrations ran')\n")
    (root / "workflows").mkdir()
    (root / "workflows" / "__init__.py").write_text(OWN_WORKFLOW, encoding="utf-8")
    return root


def test_the_wheel_adds_only_engine_with_the_migrations_inside_it(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")} == {"engine"}
    [top_level] = [name for name in names if name.endswith(".dist-info/top_level.txt")]
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["engine"]
    shipped = {name.removeprefix("engine/_migrations/") for name in names if name.startswith("engine/_migrations/")}
    scripts = {str(p.relative_to(REPO / "migrations")) for p in (REPO / "migrations").rglob("*") if p.is_file()}
    assert {"env.py", "script.py.mako", "versions/__init__.py"} <= shipped
    assert {s for s in scripts if "__pycache__" not in s} == shipped
    assert not [name for name in names if name.startswith(("workflows/", "migrations/"))]


def test_db_upgrade_in_a_users_folder_runs_railyards_migrations(site: Path, tmp_path: Path) -> None:
    folder = users_folder(tmp_path)
    url = f"sqlite:///{tmp_path / 'railyard.db'}"
    done = railyard(site, folder, "db", "upgrade", RAILYARD_DATABASE_URL=url)
    assert done.returncode == 0, done.stderr
    assert "the user migrations ran" not in done.stdout + done.stderr
    head = ScriptDirectory(migrations.script_location()).get_current_head()
    assert head is not None and migrations.current(url) == head
    listed = railyard(site, folder, "workflows", "--json", RAILYARD_DATABASE_URL=url)
    assert listed.returncode == 0, listed.stderr
    # the user's own package, by the RAILYARD_WORKFLOWS convention
    assert "own" in {w["workflow"] for w in json.loads(listed.stdout)}
    found = python(folder, "-c", "import engine.store.migrations as m; print(m.script_location())", site=site)
    assert found.stdout.strip() == str(site / "engine" / "_migrations"), found.stderr


def test_a_process_with_no_workflows_package_has_an_empty_registry(site: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'railyard.db'}"
    assert railyard(site, tmp_path, "db", "upgrade", RAILYARD_DATABASE_URL=url).returncode == 0
    listed = railyard(site, tmp_path, "workflows", RAILYARD_DATABASE_URL=url)
    assert listed.returncode == 0, listed.stderr
    assert "no workflows registered" in listed.stderr and "RAILYARD_WORKFLOWS" in listed.stderr
    started = railyard(
        site, tmp_path, "start", "expense", "--as", "ann", "--input", '{"employee": "ann", "limit_cents": 500}'
    )
    assert started.returncode == 1
    assert started.stderr.startswith("WORKFLOW_UNKNOWN:"), started.stderr
    assert "registry is empty" in started.stderr and "RAILYARD_WORKFLOWS" in started.stderr
    engine = python(tmp_path, "-c", "from engine import Engine; print(len(Engine().registry))", site=site)
    assert engine.stdout.strip() == "0", engine.stderr  # `Engine()` registers no demo workflows either


def test_railyard_demo_says_the_reference_workflows_are_not_installed(site: Path, tmp_path: Path) -> None:
    users_folder(tmp_path)  # a `workflows` package of the user's own is not the reference one
    done = railyard(site, tmp_path, "demo", RAILYARD_DATABASE_URL=f"sqlite:///{tmp_path / 'railyard.db'}")
    assert done.returncode == 2
    assert done.stderr.startswith("CONFIG_INVALID:") and "not installed" in done.stderr, done.stderr


def test_the_editable_install_adds_no_top_level_names_either(tmp_path: Path) -> None:
    probe = (
        "import importlib.util as u; from engine.store import migrations as m; "
        "print(u.find_spec('workflows'), u.find_spec('migrations'), m.script_location())"
    )
    done = python(tmp_path, "-c", probe)
    assert done.stdout.split() == ["None", "None", str(REPO / "migrations")], done.stderr
