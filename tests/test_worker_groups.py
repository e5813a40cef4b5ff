"""What `railyard status` shows of a supervisor's processes, and how soon a dying process is started again: pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from engine.core.rows import WorkerReport
from engine.core.worker_groups import shown_workers
from engine.runtime.supervisor import child_name, restart_delay

AT = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def report(name: str, pid: int, started: datetime, supervisor: dict[str, Any] | None, **counts: Any) -> WorkerReport:
    base: dict[str, Any] = {
        "claimed": 0,
        "transitions": 0,
        "released": 0,
        "handed_back": 0,
        "conflicts": 0,
        "lease_losses": 0,
    }
    base |= {"failures": 0, "config_errors": 0, "claim_latency_p50_ms": None, "claim_latency_p99_ms": None}
    base |= counts
    if supervisor is not None:
        base["supervisor"] = supervisor
    return WorkerReport(name, "host-a", pid, 4, started, AT - timedelta(seconds=2), None, base)


def test_a_supervisors_processes_are_one_worker_with_a_line_per_process() -> None:
    sup = {"name": "host-a-10-abc", "pid": 10}
    old = AT - timedelta(minutes=5)
    reports = [
        report("lone", 7, old, None, claimed=5),
        report("host-a-10-abc-p0", 11, old, sup | {"process": 0, "restarts": 0}, claimed=3, claim_latency_p99_ms=9.0),
        # Slot 1's first process died (its row lingers) and was started again: the newer one is the slot's.
        report("host-a-10-abc-p1", 12, old, sup | {"process": 1, "restarts": 0}, claimed=100),
        report("host-a-10-abc-p1r1", 13, AT, sup | {"process": 1, "restarts": 1}, claimed=4, claim_latency_p99_ms=2.0),
    ]
    group, lone = shown_workers(reports, AT)  # in name order
    assert lone["name"] == "lone" and lone["claimed"] == 5 and "processes" not in lone
    assert (group["name"], group["pid"], group["concurrency"]) == ("host-a-10-abc", 10, 8)
    assert (group["claimed"], group["restarts"], group["claim_latency_p99_ms"]) == (7, 1, 9.0)
    assert [(p["process"], p["pid"], p["claimed"]) for p in group["processes"]] == [(0, 11, 3), (1, 13, 4)]
    assert all("supervisor" not in p for p in group["processes"])


def test_a_process_dying_young_waits_longer_each_time_up_to_thirty_seconds() -> None:
    assert [restart_delay(n) for n in (1, 2, 3, 4, 5, 6, 7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_each_process_of_a_slot_has_a_name_of_its_own() -> None:
    assert [child_name("sup", 1, r) for r in (0, 1, 2)] == ["sup-p1", "sup-p1r1", "sup-p1r2"]
