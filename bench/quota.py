"""Shared quotas, priorities and the breaker under load: 4 `railyard worker` processes against a provider that
enforces its limits.

A local fake provider (a process of its own, the OpenAI wire, asyncio) enforces 600 requests and 200,000 tokens a
minute over a sliding minute, answering 429 with `Retry-After` past either; it fails 2 % of calls with a 500 and
drops 1 % of connections without an answer, and answers the rest after 0.3 s with the one-turn workflow's
`finish` (usage: the request's bytes / 4 in, 5 out). Four real `railyard worker` processes (concurrency 32 each)
on PostgreSQL run one-turn tasks under `RAILYARD_QUOTAS` set to the provider's limits. Three runs:

- **load**: 4,000 tasks (`--quick`: 600), a priority-10 task started a third of the way in. Reported: the most
  requests the provider saw in any 10-second window (target: its limit + 5 %), the 429s, throughput over the
  middle 80 % of the run against the quota (target 90 %), tasks done and tasks parked (target: all done, 0
  parked), the priority task's wait in quota slots (target: 2 at most).
- **tenants**: 3,000 tasks of one tenant (`--quick`: 450), then 100 of another (15) once the first are under
  way; the small tenant's time to finish against its time alone (target: within 2x).
- **outage**: 600 tasks (300), every call answered 503 for 30 s from 5 s in. Reported: the calls the provider
  saw during the outage, how long after it ended calls were answered again against the breaker's cool-down
  (target: within 2x), tasks done and parked after it (target: all done).

It is a benchmark, not a test: it reports the targets it meets and the ones it does not, with the machine.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from harness import bench_database, bench_parser, libpq, machine, pg_server_url, print_targets, target

from engine import Engine, Registry, StaticRoles, migrations

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RAILYARD = Path(sys.executable).with_name("railyard")

RPM, TPM = 600, 200_000
LATENCY = 0.3
ERRORS, RESETS = 0.02, 0.01
COOL_DOWN = 10.0
#: The bucket's depth in seconds of the quota: providers count in short windows too (docs/operations.md).
BURST = 0.25
PROCESSES, CONCURRENCY = 4, 32
MARK = "urgent-probe"
WORKFLOW_MODULE = """
from pydantic import BaseModel, ConfigDict

from engine import ANYONE, Action, Agent, Terminal, Workflow


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str = ""


ONE_TURN = Workflow(
    name="one_turn",
    version=1,
    description="One model turn: the only action ends the task.",
    input=Note,
    states=[Agent("answering", actions=[Action("finish", "done")]), Terminal("done")],
    operator_role=ANYONE,
)
"""


# -- the fake provider ----------------------------------------------------------------------------------------------
def serve_fake(ready: Any) -> None:
    """The provider: enforce RPM and TPM over a sliding minute, fail some calls, answer the rest; `/stats` gives
    every request's arrival (epoch seconds), status and whether it was the priority task's."""
    from aiohttp import web

    window: collections.deque[tuple[float, int]] = collections.deque()
    seen: list[tuple[float, int, bool]] = []
    state = {"outage_until": 0.0}

    async def complete(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        at = time.time()
        marked = MARK.encode() in raw
        if at < state["outage_until"]:
            seen.append((at, 503, marked))
            return web.json_response({"error": {"message": "outage", "type": "server_error"}}, status=503)
        luck = random.random()
        if luck < ERRORS:
            seen.append((at, 500, marked))
            return web.json_response({"error": {"message": "upstream failed", "type": "server_error"}}, status=500)
        if luck < ERRORS + RESETS:
            seen.append((at, 0, marked))
            assert request.transport is not None
            request.transport.abort()  # the connection dropped with no answer
            return web.Response()
        while window and window[0][0] <= at - 60:
            window.popleft()
        tokens = len(raw) // 4 + 5
        if len(window) >= RPM or sum(t for _, t in window) + tokens > TPM:
            retry = max(1, int(window[0][0] + 60 - at) + 1)
            seen.append((at, 429, marked))
            return web.json_response(
                {"error": {"message": "rate limit", "type": "rate_limit_exceeded"}},
                status=429,
                headers={"retry-after": str(retry)},
            )
        window.append((at, tokens))
        seen.append((at, 200, marked))
        await asyncio.sleep(LATENCY)
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "finish", "arguments": "{}"}}],
        }
        return web.json_response(
            {
                "id": "chatcmpl-bench",
                "object": "chat.completion",
                "created": int(at),
                "model": "bench-model",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": len(raw) // 4, "completion_tokens": 5, "total_tokens": tokens},
            }
        )

    async def stats(_request: web.Request) -> web.Response:
        return web.json_response({"seen": seen})

    async def control(request: web.Request) -> web.Response:
        body = await request.json()
        if "outage_seconds" in body:
            state["outage_until"] = time.time() + float(body["outage_seconds"])
        if body.get("reset"):
            seen.clear()
            window.clear()
        return web.json_response({"ok": True})

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", complete)
        app.router.add_get("/stats", stats)
        app.router.add_post("/control", control)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(runner, sock).start()
        ready.put(sock.getsockname()[1])
        await asyncio.Event().wait()

    asyncio.run(main())


def call_fake(port: int, path: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST" if data else "GET")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def fake_provider() -> Iterator[int]:
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    proc = ctx.Process(target=serve_fake, args=(ready,), daemon=True)
    proc.start()
    try:
        yield int(ready.get(timeout=30))
    finally:
        proc.terminate()
        proc.join(timeout=10)


# -- the workers ----------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def workers(url: str, port: int, workdir: Path) -> Iterator[None]:
    quotas = {
        "openai:bench-model": {"requests_per_minute": RPM, "input_tokens_per_minute": TPM, "burst_seconds": BURST}
    }
    env = {
        **os.environ,
        "RAILYARD_DATABASE_URL": url,
        "RAILYARD_WORKFLOWS": "quota_bench_workflows",
        "PYTHONPATH": os.pathsep.join([str(workdir), str(ROOT)]),
        "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
        "OPENAI_API_KEY": "bench",
        "RAILYARD_QUOTAS": json.dumps(quotas),
        "RAILYARD_BREAKER_COOL_DOWN": str(COOL_DOWN),
    }
    # PROCESSES processes of one each (`--processes 1`), as measured before `railyard worker` ran one per core.
    argv = [str(RAILYARD), "worker", "--processes", "1", "--concurrency", str(CONCURRENCY)]
    argv += ["--model", "openai:bench-model"]
    logs = [(workdir / f"worker-{i}.log").open("w") for i in range(PROCESSES)]
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True) for log in logs]
    try:
        # Every worker up (reported in) before anything is measured: a process's start is not the quota's doing.
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120:
            with psycopg.connect(libpq(url), autocommit=True) as conn:
                row = conn.execute("SELECT count(*) FROM workers WHERE stopped_at IS NULL").fetchone()
            if row is not None and row[0] >= PROCESSES:
                break
            time.sleep(0.2)
        yield
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in logs:
            log.close()


def truncate(url: str) -> None:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            "TRUNCATE events, snapshots, tasks, workers, flow_breakers, flow_quotas, flow_waits, flow_shares CASCADE"
        )


def counts(url: str) -> dict[str, int]:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        rows = conn.execute("SELECT status, count(*) FROM tasks GROUP BY status").fetchall()
    return {str(status): int(n) for status, n in rows}


def done_times(url: str, ids: list[str]) -> list[float]:
    """When each of `ids` ended (epoch seconds), for those that did."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT extract(epoch from updated_at) FROM tasks WHERE status = 'terminal' AND task_id = ANY(%s)", (ids,)
        ).fetchall()
    return sorted(float(r[0]) for r in rows)


def settled(url: str, ids: list[str]) -> int:
    """How many of `ids` no longer move: ended, or parked (blocked for a person after a provider error)."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM tasks WHERE status <> 'runnable' AND task_id = ANY(%s)", (ids,)
        ).fetchone()
    return int(row[0]) if row else 0


def wait_until_settled(url: str, total: int, limit_s: float) -> float:
    """Wait until every task is terminal, or none has moved for 60 s (parked), or `limit_s`; the seconds taken."""
    t0 = time.monotonic()
    last, still = -1, time.monotonic()
    while time.monotonic() - t0 < limit_s:
        found = counts(url)
        ended = found.get("terminal", 0)
        if ended >= total:
            break
        if ended != last:
            last, still = ended, time.monotonic()
        elif time.monotonic() - still > 60:
            break
        time.sleep(0.5)
    return time.monotonic() - t0


def engine_for(url: str, workdir: Path) -> Engine:
    sys.path.insert(0, str(workdir))
    from quota_bench_workflows import ONE_TURN  # type: ignore[import-not-found]

    return Engine(url, Registry([ONE_TURN]), authoriser=StaticRoles({}))


def most_in_window(times: list[float], seconds: float) -> int:
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - seconds:
            j += 1
        best = max(best, i - j + 1)
    return best


# -- the runs -------------------------------------------------------------------------------------------------------
def run_load(url: str, port: int, workdir: Path, n: int) -> dict[str, Any]:
    truncate(url)
    call_fake(port, "/control", {"reset": True})
    with engine_for(url, workdir) as eng:
        ids = [eng.start("one_turn", {}, actor="bench") for _ in range(n)]
        with workers(url, port, workdir):
            t0 = time.time()
            while counts(url).get("terminal", 0) < n // 3 and time.time() - t0 < 600:
                time.sleep(0.2)
            print(f"load: a third done after {time.time() - t0:.1f} s", flush=True)
            urgent_at = time.time()
            ids.append(eng.start("one_turn", {"note": MARK}, actor="bench", priority=10))
            seconds = wait_until_settled(url, n + 1, limit_s=n / (RPM / 60) * 4 + 120)
    seen = call_fake(port, "/stats")["seen"]
    times = sorted(at for at, _, _ in seen)
    answered = sorted(at for at, status, _ in seen if status == 200)
    urgent = [at for at, status, marked in seen if marked and status == 200]
    ends = done_times(url, ids)
    lo, hi = ends[int(len(ends) * 0.1)], ends[int(len(ends) * 0.9)]
    middle = [at for at in answered if lo <= at <= hi]
    found = counts(url)
    return {
        "tasks": n + 1,
        "seconds": round(seconds, 1),
        "most_requests_in_10s": most_in_window(times, 10.0),
        "limit_in_10s": RPM / 6,
        "requests_seen": len(seen),
        "answered": len(answered),
        "rate_limited_429": sum(1 for _, s, _ in seen if s == 429),
        "failed_500": sum(1 for _, s, _ in seen if s == 500),
        "dropped": sum(1 for _, s, _ in seen if s == 0),
        "throughput_per_s": round(len(middle) / (hi - lo), 2) if hi > lo else None,
        "quota_per_s": RPM / 60,
        "done": found.get("terminal", 0),
        "parked": n + 1 - found.get("terminal", 0),
        "urgent_wait_s": round(urgent[0] - urgent_at, 3) if urgent else None,
        "urgent_wait_slots": round((urgent[0] - urgent_at) / (60 / RPM), 1) if urgent else None,
    }


def run_tenants(url: str, port: int, workdir: Path, big: int, small: int) -> dict[str, Any]:
    def phase(n_big: int) -> tuple[float, int]:
        truncate(url)
        call_fake(port, "/control", {"reset": True})
        with engine_for(url, workdir) as eng:
            for _ in range(n_big):
                eng.start("one_turn", {}, actor="bench", tenant="batch")
            with workers(url, port, workdir):
                if n_big:
                    t0 = time.time()
                    while counts(url).get("terminal", 0) < n_big // 10 and time.time() - t0 < 600:
                        time.sleep(0.2)
                started = time.time()
                ids = [eng.start("one_turn", {}, actor="bench", tenant="small") for _ in range(small)]
                t0 = time.time()
                while settled(url, ids) < small and time.time() - t0 < 600:
                    time.sleep(0.2)
                ends = done_times(url, ids)
        return (ends[-1] - started if ends else float("nan")), len(ends)

    alone, _ = phase(0)
    shared, finished = phase(big)
    return {
        "big_tasks": big,
        "small_tasks": small,
        "small_alone_s": round(alone, 2),
        "small_beside_batch_s": round(shared, 2),
        "small_done": finished,
        "ratio": round(shared / alone, 2) if alone > 0 else None,
    }


def run_outage(url: str, port: int, workdir: Path, n: int, outage_s: float) -> dict[str, Any]:
    truncate(url)
    call_fake(port, "/control", {"reset": True})
    with engine_for(url, workdir) as eng:
        for _ in range(n):
            eng.start("one_turn", {}, actor="bench")
        with workers(url, port, workdir):
            time.sleep(5)
            began = time.time()
            call_fake(port, "/control", {"outage_seconds": outage_s})
            seconds = wait_until_settled(url, n, limit_s=n / (RPM / 60) * 4 + outage_s + 120)
    ended = began + outage_s
    seen = call_fake(port, "/stats")["seen"]
    during = [at for at, s, _ in seen if began <= at < ended]
    print(
        "outage calls (s from its start, status):",
        [(round(at - began, 2), s) for at, s, _ in seen if began <= at < ended + 2],
    )
    back = [at for at, s, _ in seen if at >= ended and s == 200]
    found = counts(url)
    resumed = back[0] - ended if back else None
    return {
        "tasks": n,
        "outage_s": outage_s,
        "cool_down_s": COOL_DOWN,
        "calls_during_outage": len(during),
        "answered_again_after_s": round(resumed, 2) if resumed is not None else None,
        "seconds": round(seconds, 1),
        "done": found.get("terminal", 0),
        "parked": n - found.get("terminal", 0),
    }


def main() -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--only", choices=("load", "tenants", "outage"), help="one run only")
    args = parser.parse_args()
    quick = args.quick
    server = pg_server_url(args.postgres_url)
    with bench_database(server) as (url, info), tempfile.TemporaryDirectory() as tmp:
        if url is None:
            print("quota.py needs PostgreSQL: nothing measured")
            return 1
        workdir = Path(tmp)
        (workdir / "quota_bench_workflows.py").write_text(WORKFLOW_MODULE, encoding="utf-8")
        migrations.upgrade(url)
        with fake_provider() as port:
            load = tenants = outage = None
            if args.only in (None, "load"):
                load = run_load(url, port, workdir, 600 if quick else 4000)
                print("load", json.dumps(load), flush=True)
            if args.only in (None, "tenants"):
                tenants = run_tenants(url, port, workdir, 450 if quick else 3000, 15 if quick else 100)
                print("tenants", json.dumps(tenants), flush=True)
            if args.only in (None, "outage"):
                outage = run_outage(url, port, workdir, 300 if quick else 600, 30.0)
                print("outage", json.dumps(outage), flush=True)
    if load is None or tenants is None or outage is None:
        return 0
    targets = [
        target(
            "requests in any 10 s / limit",
            load["most_requests_in_10s"] / load["limit_in_10s"],
            "<",
            1.05 + 1e-9,
            "the provider sees at most its limit + 5 %",
        ),
        target("tasks parked (load)", float(load["parked"]), "<", 0.5, "every task done, none parked"),
        target(
            "throughput / quota",
            (load["throughput_per_s"] or 0) / load["quota_per_s"],
            ">=",
            0.9,
            "middle 80 % of the run",
        ),
        target(
            "small tenant beside a batch / alone",
            tenants["ratio"],
            "<",
            2.0 + 1e-9,
            f"{tenants['small_tasks']} tasks beside {tenants['big_tasks']}",
        ),
        target(
            "priority-10 task's wait, in quota slots",
            load["urgent_wait_slots"],
            "<",
            2.0 + 1e-9,
            "started a third of the way in",
        ),
        target(
            "answered again after the outage / cool-down",
            outage["answered_again_after_s"] / COOL_DOWN if outage["answered_again_after_s"] is not None else None,
            "<",
            2.0 + 1e-9,
            f"{outage['outage_s']:.0f} s of 503s, cool-down {COOL_DOWN:.0f} s",
        ),
        target("tasks parked (outage)", float(outage["parked"]), "<", 0.5, "every task done after the outage"),
    ]
    print_targets(targets)
    print(
        json.dumps(
            {
                "bench": "quota",
                "quick": quick,
                "machine": machine(info.get("server_version")),
                "load": load,
                "tenants": tenants,
                "outage": outage,
                "targets": targets,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
