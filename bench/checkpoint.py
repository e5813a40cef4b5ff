"""Checkpoint benchmark: signing every task's head and judging a database against it, on PostgreSQL.

  checkpoint   `Engine.checkpoint`: stream every task's (task_id, seq, last_hash) in task id byte order, build the
               RFC 6962 Merkle root one leaf at a time, write the file, sign the header (Ed25519), note the root
  verify       `Engine.judge_checkpoint`: the file's signature and root, then the file merged with the database's
               heads, task by task
  raw          psycopg by hand: `SELECT task_id, seq, last_hash FROM tasks ORDER BY task_id COLLATE "C"` through a
               server-side cursor, fetched, nothing computed

for 10,000 and 100,000 tasks (and 1,000,000 in the full run). The task rows are bulk-loaded with COPY (a
checkpoint reads rows only). The peak memory (`ru_maxrss`) of a checkpoint and of a verification, each in a
fresh subprocess, at each size: flat memory means the same figure at every size.

Rates are medians over rounds (each round: raw, then checkpoint, then verify). The last line of output is one
JSON object: figures, baselines, ratios and targets.

    python bench/checkpoint.py            # full run, a few minutes
    python bench/checkpoint.py --quick    # under a minute
"""

from __future__ import annotations

import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    background_busy,
    bench_database,
    bench_parser,
    libpq,
    machine,
    pg_server_url,
    print_background,
    print_targets,
    target,
)

from engine import Engine, Registry, migrations
from engine.audit.checkpoint import keygen

TASK_COLUMNS = "task_id, workflow, version, digest, state, status, seq, last_hash, created_at, updated_at"
EVENT_COLUMNS = "task_id, seq, at, actor, from_state, trigger, to_state, data, prev_hash, hash"

#: A subprocess that takes (or verifies) one checkpoint and prints its peak RSS in KiB.
MEMORY_PROBE = """
import resource, sys
from engine import Engine, Registry
url, what, key, where, public = sys.argv[1:6]
with Engine(url, Registry([])) as engine:
    if what == "checkpoint":
        engine.audit.checkpoint(key, where)
    else:
        engine.audit.judge_checkpoint(where, public)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def load_tasks(url: str, first: int, count: int) -> None:
    """COPY `count` task rows (ids `first` ...), each at some seq with a hash, and the event at that seq with that
    hash: what a checkpoint signs (the rows) and what its judgement reads back (the log at the head)."""
    with psycopg.connect(libpq(url)) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY tasks ({TASK_COLUMNS}) FROM STDIN") as copy:
            for i in range(first, first + count):
                copy.write_row(
                    (
                        f"task-{i:08d}",
                        "tick",
                        1,
                        "d" * 64,
                        "counting",
                        "runnable",
                        1 + i % 40,
                        head_hash(i),
                        "2026-12-01T00:00:00Z",
                        "2026-12-01T00:00:00Z",
                    )
                )
        with cur.copy(f"COPY events ({EVENT_COLUMNS}) FROM STDIN") as copy:
            for i in range(first, first + count):
                seq = 1 + i % 40
                copy.write_row(
                    (
                        f"task-{i:08d}",
                        seq,
                        "2026-12-01T00:00:00Z",
                        "bench",
                        "counting",
                        "tick",
                        "counting",
                        "{}",
                        "0" * 64,
                        head_hash(i),
                    )
                )
        conn.commit()


def head_hash(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def raw_scan(url: str) -> int:
    with psycopg.connect(libpq(url)) as conn, conn.transaction(), conn.cursor(name="heads") as cur:
        cur.execute('SELECT task_id, seq, last_hash FROM tasks ORDER BY task_id COLLATE "C"')
        n = 0
        while rows := cur.fetchmany(10_000):
            n += len(rows)
        return n


def peak_kib(url: str, what: str, key: Path, where: Path, public: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, url, what, str(key), str(where), public],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    return int(done.stdout.strip().splitlines()[-1])


def main() -> int:
    args = bench_parser(__doc__).parse_args()
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    rounds = 3 if args.quick else 5
    print_background(background_busy(1.0))
    results: dict[str, Any] = {"sizes": {}}
    with bench_database(pg_server_url(args.postgres_url)) as (url, info), tempfile.TemporaryDirectory() as tmp:
        if url is None:
            print("no PostgreSQL: nothing measured")
            return 0
        migrations.upgrade(url)
        key = Path(tmp) / "signing.key"
        public = keygen(key)
        loaded = 0
        with Engine(url, Registry([])) as engine:
            for size in sizes:
                load_tasks(url, loaded, size - loaded)
                loaded = size
                raw_s, take_s, judge_s = [], [], []
                path = Path(tmp)
                for r in range(rounds):
                    t0 = time.perf_counter()
                    assert raw_scan(url) == size
                    raw_s.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    header, path, _ = engine.audit.checkpoint(key, Path(tmp) / f"cp-{size}-{r}")
                    take_s.append(time.perf_counter() - t0)
                    assert header.tree_size == size
                    t0 = time.perf_counter()
                    _, reports = engine.audit.judge_checkpoint(path, public)
                    judge_s.append(time.perf_counter() - t0)
                    assert reports == []
                memory = {
                    "checkpoint_kib": peak_kib(url, "checkpoint", key, Path(tmp) / f"probe-{size}", public),
                    "verify_kib": peak_kib(url, "verify", key, path, public),
                }
                raw, take, judge = (statistics.median(x) for x in (raw_s, take_s, judge_s))
                results["sizes"][size] = {
                    "raw_s": round(raw, 4),
                    "checkpoint_s": round(take, 4),
                    "verify_s": round(judge, 4),
                    "checkpoint_per_raw": round(take / raw, 2),
                    "verify_per_raw": round(judge / raw, 2),
                    "file_bytes": path.stat().st_size,
                    **memory,
                }
                print(
                    f"{size:>9,} tasks: raw scan {raw * 1000:8.1f} ms | checkpoint {take * 1000:8.1f} ms "
                    f"({take / raw:5.1f}x raw) | verify {judge * 1000:8.1f} ms ({judge / raw:5.1f}x raw) | "
                    f"peak RSS checkpoint {memory['checkpoint_kib'] / 1024:.0f} MiB, "
                    f"verify {memory['verify_kib'] / 1024:.0f} MiB",
                    flush=True,
                )
        at_100k = results["sizes"][100_000]
        smallest, largest = results["sizes"][sizes[0]], results["sizes"][sizes[-1]]
        targets = [
            target("checkpoint of 100,000 tasks, seconds", at_100k["checkpoint_s"], "<", 2.0, "issue #15"),
            target(
                "checkpoint peak memory, largest / smallest size",
                largest["checkpoint_kib"] / smallest["checkpoint_kib"],
                "<",
                1.5,
                "flat in the number of tasks",
            ),
            target(
                "verify peak memory, largest / smallest size",
                largest["verify_kib"] / smallest["verify_kib"],
                "<",
                1.5,
                "flat in the number of tasks",
            ),
        ]
        print_targets(targets)
        print(
            json.dumps(
                {"bench": "checkpoint", **results, "targets": targets, "machine": machine(info.get("server_version"))}
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
