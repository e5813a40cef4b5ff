"""The live workers as `railyard status` shows them: a supervisor's processes as one worker, a line per process.

Each process of `railyard worker --processes N` reports its own row to the `workers` table (its counts are its
own, and a process that dies leaves its row behind), naming its supervisor in `counts["supervisor"]`. Here those
rows become one entry: the counts summed over the processes running now, and the processes themselves, one per
slot. A slot whose process died and was started again has two rows for a while (the dead one ages out of
`status` after a minute): the newer one is the slot's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from engine.core.rows import WorkerReport

#: The counts that add up over processes. Claim latencies do not: a group shows its slowest process's.
SUMMED = ("claimed", "transitions", "released", "handed_back", "conflicts", "lease_losses", "failures", "config_errors")
LATENCIES = ("claim_latency_p50_ms", "claim_latency_p99_ms")


def shown_workers(reports: list[WorkerReport], at: datetime) -> list[dict[str, Any]]:
    """One dict per worker: a process on its own as it reported, a supervisor's processes as one, in name order."""
    alone: list[dict[str, Any]] = []
    groups: dict[str, dict[int, tuple[WorkerReport, dict[str, Any]]]] = {}
    for report in reports:
        counts = dict(report.counts)
        group = counts.pop("supervisor", None)
        if not isinstance(group, dict):
            alone.append(_process(report, counts, at))
            continue
        slots = groups.setdefault(str(group["name"]), {})
        index = int(group["process"])
        kept = slots.get(index)
        if kept is None or report.started_at > kept[0].started_at:
            slots[index] = (report, {**counts, "restarts": int(group.get("restarts", 0))})
    shown = alone + [_group(name, slots, at) for name, slots in groups.items()]
    return sorted(shown, key=lambda w: str(w["name"]))


def _process(report: WorkerReport, counts: dict[str, Any], at: datetime) -> dict[str, Any]:
    return {
        "name": report.name,
        "host": report.host,
        "pid": report.pid,
        "concurrency": report.concurrency,
        "seen_seconds_ago": round((at - report.seen_at).total_seconds(), 1),
        **counts,
    }


def _group(name: str, slots: dict[int, tuple[WorkerReport, dict[str, Any]]], at: datetime) -> dict[str, Any]:
    processes = [
        {"process": index, **_process(report, counts, at)} for index, (report, counts) in sorted(slots.items())
    ]
    first = next(iter(slots.values()))[0]
    doc: dict[str, Any] = {
        "name": name,
        "host": first.host,
        "pid": int(first.counts["supervisor"].get("pid", 0)),
        "concurrency": sum(p["concurrency"] for p in processes),
        "seen_seconds_ago": min(p["seen_seconds_ago"] for p in processes),
    }
    for key in SUMMED:
        doc[key] = sum(int(p.get(key) or 0) for p in processes)
    for key in LATENCIES:
        values = [p[key] for p in processes if p.get(key) is not None]
        doc[key] = max(values) if values else None
    doc["restarts"] = sum(p["restarts"] for p in processes)
    doc["processes"] = processes
    return doc
