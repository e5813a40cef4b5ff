"""The route on the task page: the workflow drawn as SVG by the server, the task's path and its current state
highlighted, internal states folded into their state unless asked for, nothing fetched from elsewhere."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from engine import Engine, Workflow
from engine.api.route import ROUTINE, layout, public_name, svg, visits_of
from engine.core.canonical import GENESIS_HASH, now
from engine.core.events import seal
from tests.support.api import make_api_engine, make_app, to_approval
from tests.support.sample_workflows import all_workflows
from workflows import EXPENSE, REFUND_V1, REFUND_V2, TICKET_TRIAGE

SVG = "{http://www.w3.org/2000/svg}"
ONCE = "\u00d71"  # "taken once", with the multiplication sign
DEFINITIONS = [REFUND_V1, REFUND_V2, EXPENSE, TICKET_TRIAGE, *all_workflows()]

#: The refund's happy path, with a repair on the way (an internal `~force` state) and an order lookup.
HAPPY = {
    ("collecting_information", "query_order", "looking_up_order"): 1,
    ("looking_up_order", "succeeded", "collecting_information"): 1,
    ("collecting_information", "repair", "collecting_information~force"): 1,
    ("collecting_information~force", "assess_eligibility", "eligible"): 1,
    ("eligible", "propose_refund", "awaiting_approval"): 1,
    ("awaiting_approval", "approve", "executing"): 1,
    ("executing", "succeeded", "completed"): 1,
}


def drawn(definition: Workflow, visits: dict[tuple[str, str, str], int], current: str | None, **kw: bool) -> ET.Element:
    return ET.fromstring(str(svg(layout(definition, visits, current, **kw), definition.ref)))


def states_of(root: ET.Element) -> dict[str, ET.Element]:
    return {g.attrib["data-state"]: g for g in root.iter(f"{SVG}g") if "data-state" in g.attrib}


@pytest.mark.parametrize("definition", DEFINITIONS, ids=lambda d: d.ref)
def test_every_declared_move_is_drawn_and_no_two_states_overlap(definition: Workflow) -> None:
    route = layout(definition)
    boxes = [(n.x, n.y, n.x + n.width, n.y + 38) for n in route.states()]
    for i, (x0, y0, x1, y1) in enumerate(boxes):
        for a, b, c, d in boxes[i + 1 :]:
            assert x1 <= a or x0 >= c or y1 <= b or y0 >= d, f"{definition.ref}: two states overlap"
        assert x1 <= route.width and y1 <= route.height
    edges = {(e.source, e.target) for e in route.edges}
    for source, action in definition.transitions():
        for target in action.targets():
            upper, lower = public_name(source), public_name(target)
            if action.name in ROUTINE or (upper == lower and (upper, lower) != (source, target)):
                continue
            assert (upper, lower) in edges, f"{definition.ref}: {source} --{action.name}--> {target} is not drawn"
    assert all("~" not in n.name for n in route.states())
    for e in route.edges:  # each line runs layer by layer through its waypoints
        chain = [e.target, *e.via, e.source] if e.upward else [e.source, *e.via, e.target]
        ranks = [route.nodes[n].rank for n in chain]
        assert e.source == e.target or ranks == list(range(ranks[0], ranks[0] + len(ranks)))


def test_the_path_taken_and_the_current_state_stand_out() -> None:
    root = drawn(REFUND_V2, HAPPY, "completed")
    states = states_of(root)
    visited = {name for name, g in states.items() if "visited" in g.attrib["class"].split()}
    assert visited == {
        "collecting_information",
        "looking_up_order",
        "eligible",
        "awaiting_approval",
        "executing",
        "completed",
    }
    assert [name for name, g in states.items() if g.attrib.get("aria-current") == "step"] == ["completed"]
    taken = [g for g in root.iter(f"{SVG}g") if g.attrib.get("class") == "edge taken"]
    labels = sorted("".join(g.itertext()) for g in taken)
    # The repair into collecting_information~force is part of the stay in collecting_information: the line
    # out of it is the eligibility assessment, drawn from the state it belongs to.
    assert labels == [
        f"approve {ONCE}",
        f"assess_eligibility {ONCE}",
        f"propose_refund {ONCE}",
        f"query_order {ONCE}",
        f"succeeded {ONCE}",
        f"succeeded, failed … {ONCE}",
    ]
    assert "limit_exceeded" not in states  # only a routine move (a budget's limit) leads there
    description = root.find(f"{SVG}desc")
    assert root.find(f"{SVG}title") is not None and description is not None
    assert "completed (current)" in "".join(description.itertext())


def test_internal_states_are_folded_unless_asked_for_and_a_cancel_taken_is_drawn() -> None:
    folded = states_of(drawn(REFUND_V2, HAPPY, "eligible~provider_error"))
    assert not any("~" in name for name in folded)
    here = folded["eligible"]
    assert here.attrib["aria-current"] == "step" and "eligible · provider_error" in "".join(here.itertext())
    apart = states_of(drawn(REFUND_V2, HAPPY, "eligible~provider_error", internal=True))
    assert {"collecting_information~force", "eligible~provider_error"} <= set(apart)
    assert apart["eligible~provider_error"].attrib["aria-current"] == "step"
    cancelled = states_of(drawn(REFUND_V2, {("awaiting_approval", "cancel", "cancelled"): 1}, "cancelled"))
    assert "current" in cancelled["cancelled"].attrib["class"].split()


def test_names_are_escaped_in_the_drawing() -> None:
    route = layout(REFUND_V2)
    next(iter(route.nodes.values())).name = "<script>x</script>"
    text = str(svg(route, 'a "title" <b>'))
    assert "<script>" not in text and "&lt;script&gt;" in text
    ET.fromstring(text)  # still well-formed


def test_the_path_list_folds_a_repair_into_the_stay_it_belongs_to() -> None:
    at = now()
    steps = [
        (None, "start", "collecting_information"),
        ("collecting_information", "repair", "collecting_information~force"),
        ("collecting_information~force", "assess_eligibility", "eligible"),
        ("eligible", "propose_refund", "awaiting_approval"),
    ]
    events, prev = [], GENESIS_HASH
    for seq, (source, trigger, target) in enumerate(steps, start=1):
        e = seal(
            task_id="t",
            seq=seq,
            at=at,
            actor="a",
            from_state=source,
            trigger=trigger,
            to_state=target,
            data={},
            prev_hash=prev,
        )
        events.append(e)
        prev = e.hash
    assert [(v.state, v.seq) for v in visits_of(events)] == [
        ("collecting_information", 1),
        ("eligible", 3),
        ("awaiting_approval", 4),
    ]
    assert [v.state for v in visits_of(events, internal=True)] == [
        "collecting_information",
        "collecting_information~force",
        "eligible",
        "awaiting_approval",
    ]


@pytest.fixture
def client(db_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, Engine]]:
    with make_api_engine(db_url, tmp_path) as eng, TestClient(make_app(eng), follow_redirects=False) as c:
        yield c, eng


def test_the_task_page_draws_the_route_inline_with_nothing_from_elsewhere(client: tuple[TestClient, Engine]) -> None:
    http, engine = client
    task_id = to_approval(engine)
    page = http.get("/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    http.post("/login", data={"token": "tok-bob", "csrf": csrf.group(1)})
    response = http.get(f"/tasks/{task_id}")
    assert response.status_code == 200
    found = re.search(r"<svg .*?</svg>", response.text, flags=re.S)
    assert found, "no drawing on the task page"
    root = ET.fromstring(found.group(0))
    states = states_of(root)
    current = engine.load(task_id).state
    assert [n for n, g in states.items() if g.attrib.get("aria-current") == "step"] == [public_name(current)]
    assert re.findall(r"https?://", found.group(0)) == ["http://"]  # the SVG namespace, nothing fetched
    assert "script-src" in response.headers["content-security-policy"]
    apart = http.get(f"/tasks/{task_id}?internal=1")
    assert apart.status_code == 200 and 'href="?"' in apart.text
