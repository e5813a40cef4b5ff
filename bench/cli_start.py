"""CLI start-up benchmark: how long `railyard --version`, `railyard --help` and a real command take, from the
shell's fork to the exit, next to Python doing nothing and Python importing Typer, in the same run.

Every `railyard` call pays its imports before its command runs, so this is the latency of every command a person
or a script types. Each case is a fresh process of the installed console script (`.venv/bin/railyard`, or
`python -m engine.cli` without one), its output read from a pipe as a script reads it:

- `python -c pass`: the interpreter's own start (the baseline every figure is a ratio to);
- `python -c "import typer"`: the least a Typer program can import;
- `railyard --version`, `railyard --help` and `railyard start --help` (a command's help, which builds the same
  tree); the target of issue #29 is 0.25 s for the first two;
- `railyard status --json` on an empty SQLite database (migrated before the run, not timed): a command that
  does its work, with the engine, SQLAlchemy and the workflow definitions imported.

Bytecode is cached, as for an installed command: the children run with PYTHONPYCACHEPREFIX in a temporary
folder (not the checkout's `__pycache__`) and without PYTHONDONTWRITEBYTECODE, and each case runs once before
the timed rounds.

The rounds are interleaved (every case once per round), so drift in the machine's speed touches each figure and
its baselines alike; a figure is the median over the rounds of the wall time (`CPU` is the child's own user and
system time, which other work on the machine disturbs less). Before each round the run waits a few seconds at
most for other work to leave the CPUs alone. The last line of output is one JSON object (`figures`,
`baselines`, `ratios`, `targets` with `met`, `machine`).

    python bench/cli_start.py            # 25 rounds, about a minute
    python bench/cli_start.py --quick    # 7 rounds
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness import (
    background_busy,
    bench_parser,
    machine,
    print_background,
    print_targets,
    reference_ms,
    target,
    wait_quiet,
)

REPO = Path(__file__).resolve().parent.parent
#: What issue #29 asks of `railyard --version` and `railyard --help`, in seconds.
BUDGET_S = 0.25


@dataclass(frozen=True)
class Case:
    name: str
    argv: list[str]


def railyard() -> list[str]:
    """The installed console script beside this interpreter, as a user runs it; `python -m engine.cli` without."""
    script = Path(sys.executable).parent / "railyard"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "engine.cli"]


def cases() -> list[Case]:
    program = railyard()
    return [
        Case("python -c pass", [sys.executable, "-c", "pass"]),
        Case("python -c 'import typer'", [sys.executable, "-c", "import typer"]),
        Case("railyard --version", [*program, "--version"]),
        Case("railyard --help", [*program, "--help"]),
        Case("railyard start --help", [*program, "start", "--help"]),
        Case("railyard status --json (empty SQLite)", [*program, "status", "--json"]),
    ]


def environment(folder: Path, cache: Path) -> dict[str, str]:
    """The children's environment: an empty SQLite database, no workflows of the user's, bytecode cached in
    `cache`; no OTEL_* (no exporter to wait for) and no terminal width of the caller's."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OTEL_", "RAILYARD_")) and k not in ("PYTHONDONTWRITEBYTECODE", "TERMINAL_WIDTH")
    }
    env["RAILYARD_DATABASE_URL"] = f"sqlite:///{folder / 'empty.db'}"
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def run_once(case: Case, env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and the child's CPU seconds of one run; fails the benchmark if the command failed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(case.argv, env=env, cwd=cwd, capture_output=True, check=False, timeout=120)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{case.name} failed (exit {done.returncode}): {done.stderr.decode(errors='replace')}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> int:
    args = bench_parser(__doc__).parse_args()
    rounds = 7 if args.quick else 25
    print_background(background_busy(1.0))
    every = cases()
    walls: dict[str, list[float]] = {c.name: [] for c in every}
    cpus: dict[str, list[float]] = {c.name: [] for c in every}
    reference = reference_ms()
    with tempfile.TemporaryDirectory(prefix="railyard-cli-start-") as tmp:
        folder = Path(tmp)
        cache = folder / "pycache"
        env = environment(folder, cache)
        # The database `status` reads, and the bytecode cache each cached case then finds warm.
        subprocess.run([*railyard(), "db", "upgrade"], env=env, cwd=folder, capture_output=True, check=True)
        for case in every:
            run_once(case, env, folder)
        waited = 0.0
        for _ in range(rounds):
            waited += wait_quiet(3.0)
            for case in every:
                wall, used = run_once(case, env, folder)
                walls[case.name].append(wall)
                cpus[case.name].append(used)
        shutil.rmtree(cache, ignore_errors=True)
    median = {name: statistics.median(times) for name, times in walls.items()}
    cpu = {name: statistics.median(times) for name, times in cpus.items()}
    base, typer = median["python -c pass"], median["python -c 'import typer'"]
    print(f"{rounds} rounds, each case once per round (waited {waited:.0f} s in all for quiet CPUs)")
    print(f"{'case':<40} {'median':>9} {'min':>9} {'max':>9} {'CPU':>9} {'x pass':>7} {'x typer':>8}")
    for name, times in walls.items():
        print(
            f"{name:<40} {median[name] * 1000:7.0f} ms {min(times) * 1000:6.0f} ms {max(times) * 1000:6.0f} ms "
            f"{cpu[name] * 1000:6.0f} ms {median[name] / base:7.1f} {median[name] / typer:8.1f}"
        )
    help_s, version_s = median["railyard --help"], median["railyard --version"]
    print(
        f"Railyard's own share of --help, beyond importing Typer: {(help_s - typer) * 1000:.0f} ms; "
        f"of --version: {(version_s - typer) * 1000:.0f} ms"
    )
    targets = [
        target(
            "railyard --version, median seconds", version_s, "<", BUDGET_S, "issue #29", walls["railyard --version"]
        ),
        target("railyard --help, median seconds", help_s, "<", BUDGET_S, "issue #29", walls["railyard --help"]),
    ]
    print_targets(targets)
    figures = {
        name: {"median_ms": round(m * 1000, 1), "cpu_ms": round(cpu[name] * 1000, 1)} for name, m in median.items()
    }
    print(
        json.dumps(
            {
                "bench": "cli_start",
                "rounds": rounds,
                "figures": {k: v for k, v in figures.items() if k.startswith("railyard")},
                "baselines": {k: v for k, v in figures.items() if not k.startswith("railyard")},
                "ratios": {
                    name: {"to_pass": round(m / base, 2), "to_import_typer": round(m / typer, 2)}
                    for name, m in median.items()
                    if name.startswith("railyard")
                },
                "targets": targets,
                "all_met": all(t["met"] for t in targets),
                "reference_ms": reference,
                "machine": machine(None),
            },
            default=str,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
