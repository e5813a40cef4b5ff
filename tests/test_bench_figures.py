"""bench/figures.py, which runs the benchmarks and keeps every target in one table (issue #33): what it reads from
each benchmark's JSON line, what it says of one that fails, and the block it writes into docs/performance.md."""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


def figures_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_figures", REPO / "bench" / "figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_bench(folder: Path, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(body), encoding="utf-8")


def test_one_table_holds_every_benchmarks_targets_and_names_the_one_that_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    figures = figures_module()
    target = {"name": "engine / raw", "value": 0.82, "op": ">=", "threshold": 0.8, "met": True, "note": ""}
    missed = {"name": "SQLite / raw", "value": 0.31, "op": ">=", "threshold": 0.5, "met": False, "note": ""}
    fake_bench(
        tmp_path,
        "good",
        f"""
        import json, sys
        print("a table for people")
        print('{{"not": "the report"}}')
        print(json.dumps({{"bench": "good", "quick": "--quick" in sys.argv, "machine": {{"nproc": 2}},
                          "targets": {[target, missed]!r}}}))
        print("a line after the report")
        """,
    )
    fake_bench(tmp_path, "broken", "import sys\nprint('Traceback: it fell over')\nsys.exit(2)\n")
    monkeypatch.setattr(figures, "HERE", tmp_path)
    monkeypatch.setattr(figures, "BENCHES", ("good", "broken"))
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\nBefore.\n\n<!-- figures:start -->\nold\n<!-- figures:end -->\n\nAfter.\n")

    assert figures.main(["--quick", "--write", str(doc)]) == 1  # one benchmark printed no report
    out = capsys.readouterr().out
    report = json.loads(out.strip().splitlines()[-1])
    assert [(t["bench"], t["name"], t["met"]) for t in report["targets"]] == [
        ("good", "engine / raw", True),
        ("good", "SQLite / raw", False),
        ("broken", "(no report: the benchmark failed)", None),
    ]
    assert report["all_met"] is False and report["quick"] is True and report["machine"] == {"nproc": 2}
    assert "1 of 3 targets met" in out and "Traceback: it fell over" in out  # the benchmark's own output streams

    text = doc.read_text()
    assert text.startswith("# Performance\n\nBefore.\n\n<!-- figures:start -->\n") and text.endswith(
        "<!-- figures:end -->\n\nAfter.\n"
    )
    assert "\nold\n" not in text and "`bench/figures.py --quick` on 2 CPUs" in text
    assert "| good | SQLite / raw | 0.31 | >= 0.5 | NOT MET |" in text
    # A second run replaces the block; it does not add another.
    assert figures.main(["--only", "good", "--write", str(doc)]) == 0
    assert doc.read_text().count("<!-- figures:start -->") == 1


def test_an_unknown_benchmark_is_refused_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    figures = figures_module()
    with pytest.raises(SystemExit) as refused:
        figures.main(["--only", "append,nosuch"])
    assert refused.value.code == 2 and "unknown benchmark(s) nosuch" in capsys.readouterr().err


def test_the_benchmarks_it_runs_are_the_ones_in_bench() -> None:
    figures = figures_module()
    for name in figures.BENCHES:
        assert (REPO / "bench" / f"{name}.py").is_file(), name
