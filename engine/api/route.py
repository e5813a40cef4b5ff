"""The route a task took, drawn as SVG in the page: the workflow's states laid out in layers, the edges the
task took and the state it is in highlighted.

The server draws it, so nothing is fetched from outside (the pages' CSP allows no script or style from
elsewhere) and it reads without JavaScript. The drawing is a small layered layout (ranks by longest path
from the initial state once back edges are set aside, a few barycentre sweeps to untangle each layer),
which suits workflow graphs: a few dozen states, mostly forward.

Internal states (`claim~force`, `claim~provider_error`: a name with `~`) are folded into the state they
belong to, and the engine's own triggers that every step may take (cancel, limits, repairs, the tool
runner's call and reconcile) are left off unless the task took them: drawn on every state they would bury
the route, and the page says so under the drawing.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

from engine.audit.reads import path_visits
from engine.core.definition import (
    BACKOFF,
    CALL,
    CANCEL,
    DEMOTE,
    LIMIT,
    PROVIDER_ERROR,
    RECONCILE,
    REPAIR,
    StateKind,
    Workflow,
)
from engine.core.events import Event
from engine.core.machine import UNDRAWN

#: The engine's own triggers, drawn only where the task took them.
ROUTINE = frozenset({CANCEL, LIMIT, REPAIR, DEMOTE, BACKOFF, CALL, RECONCILE, PROVIDER_ERROR, *UNDRAWN})

NODE_HEIGHT = 38
LAYER_GAP = 72
NODE_GAP = 28
MARGIN = 40
WAYPOINT_WIDTH = 14
LABEL_CHAR_WIDTH = 6.1
CHAR_WIDTH = 7.2  # of the 13 px sans-serif the labels use, on average: enough to size a box


def public_name(state: str) -> str:
    """The state an internal state belongs to: `claim~force` is part of `claim`."""
    return state.split("~", 1)[0]


@dataclass(slots=True)
class Node:
    name: str
    kind: str
    rank: int = 0
    order: float = 0.0
    x: float = 0.0
    y: float = 0.0
    width: float = 0.0
    visited: bool = False
    current: bool = False
    #: Where in the state the task is, when it is in one of its internal states ("handoff", "force"...).
    detail: str | None = None
    #: A waypoint of an edge that spans several layers, laid out like a narrow state so edges go round states.
    waypoint: bool = False

    @property
    def label(self) -> str:
        return self.name if self.detail is None else f"{self.name} · {self.detail}"

    @property
    def centre(self) -> float:
        return self.x + self.width / 2


@dataclass(slots=True)
class Edge:
    source: str
    target: str
    triggers: list[str] = field(default_factory=list)
    taken: int = 0
    #: The waypoints between source and target, top to bottom (names of waypoint nodes).
    via: list[str] = field(default_factory=list)
    #: Laid out from target to source: an edge back up to a state drawn higher.
    upward: bool = False
    #: Where the line leaves the upper state and enters the lower one (x), set by `_ports`.
    top_x: float = 0.0
    bottom_x: float = 0.0


@dataclass(frozen=True, slots=True)
class Route:
    """A laid-out drawing: what `svg` renders and what tests read."""

    nodes: dict[str, Node]
    edges: list[Edge]
    width: float
    height: float

    def states(self) -> list[Node]:
        return [n for n in self.nodes.values() if not n.waypoint]


def layout(
    definition: Workflow,
    visits: Mapping[tuple[str, str, str], int] | None = None,
    current: str | None = None,
    *,
    internal: bool = False,
) -> Route:
    """The states and edges to draw, placed. `visits` counts the (source, trigger, target) edges a task took;
    `internal` keeps `~` states as states of their own."""
    taken = dict(visits or {})
    name = (lambda s: s) if internal else public_name
    nodes: dict[str, Node] = {}
    for state in definition.all_states:
        shown = name(state.name)
        if shown not in nodes:
            nodes[shown] = Node(shown, str(definition.state(shown).kind))
    edges: dict[tuple[str, str], Edge] = {}
    for source, action in definition.transitions():
        for target in action.targets():
            count = taken.get((source, action.name, target), 0)
            a, b = name(source), name(target)
            if a == b and (source != a or target != b):
                continue  # a step into the state's own internal state: part of the state
            if action.name in ROUTINE and not count:
                continue
            edge = edges.setdefault((a, b), Edge(a, b))
            if action.name not in edge.triggers:
                edge.triggers.append(action.name)
            edge.taken += count
    for source, _trigger, target in taken:
        for end in (source, target):
            if name(end) in nodes:
                nodes[name(end)].visited = True
    if current is not None and name(current) in nodes:
        here = nodes[name(current)]
        here.current = here.visited = True
        if current != here.name:
            here.detail = current.split("~", 1)[1]
    initial = name(definition.initial_state)
    nodes[initial].visited = True
    # A state nothing drawn leads to or from (cancelled, limit_exceeded, when only routine edges reach them)
    # is left off, unless the task is or was there.
    linked = {e.source for e in edges.values()} | {e.target for e in edges.values()} | {initial}
    nodes = {k: n for k, n in nodes.items() if k in linked or n.visited}
    drawn = [e for e in edges.values() if e.source in nodes and e.target in nodes]
    _rank(nodes, drawn, initial)
    _waypoints(nodes, drawn)
    _order(nodes, drawn)
    width, height = _place(nodes)
    _ports(nodes, drawn)
    return Route(nodes, drawn, width, height)


def _rank(nodes: dict[str, Node], edges: list[Edge], initial: str) -> None:
    """Longest-path layers over the forward edges; back edges (found by a depth-first walk from the initial
    state, in declaration order) are turned round for the layout and drawn upward."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for e in edges:
        if e.source != e.target:
            out[e.source].append(e.target)
    back: set[tuple[str, str]] = set()
    seen: dict[str, int] = {}  # 1: on the walk's path, 2: done
    finished: list[str] = []

    def walk(start: str) -> None:
        stack = [(start, iter(out[start]))]
        seen[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                seen[node] = 2
                finished.append(node)
                stack.pop()
            elif seen.get(child) == 1:
                back.add((node, child))
            elif child not in seen:
                seen[child] = 1
                stack.append((child, iter(out[child])))

    walk(initial)
    for n in nodes:
        if n not in seen:
            walk(n)
    for n in reversed(finished):  # a topological order of the forward edges
        for child in out[n]:
            if (n, child) not in back:
                nodes[child].rank = max(nodes[child].rank, nodes[n].rank + 1)
    for e in edges:
        e.upward = (e.source, e.target) in back or (
            e.source != e.target and nodes[e.target].rank <= nodes[e.source].rank
        )


def _waypoints(nodes: dict[str, Node], edges: list[Edge]) -> None:
    for i, e in enumerate(edges):
        if e.source == e.target:
            continue
        upper, lower = (e.target, e.source) if e.upward else (e.source, e.target)
        if nodes[lower].rank <= nodes[upper].rank:  # an upward edge between states of one layer
            nodes[lower].rank = nodes[upper].rank + 1
        for rank in range(nodes[upper].rank + 1, nodes[lower].rank):
            key = f"\x00{i}:{rank}"
            nodes[key] = Node(key, "waypoint", rank=rank, waypoint=True)
            e.via.append(key)


def _chain(e: Edge) -> list[str]:
    """The edge's nodes top to bottom."""
    upper, lower = (e.target, e.source) if e.upward else (e.source, e.target)
    return [upper, *e.via, lower]


def _order(nodes: dict[str, Node], edges: list[Edge]) -> None:
    """Positions within each layer: declaration order first, then barycentres of the neighbours, down and up."""
    layers: dict[int, list[Node]] = {}
    for i, node in enumerate(nodes.values()):
        node.order = float(i)
        layers.setdefault(node.rank, []).append(node)
    near: dict[str, list[str]] = {n: [] for n in nodes}
    for e in edges:
        if e.source == e.target:
            continue
        chain = _chain(e)
        for a, b in itertools.pairwise(chain):
            near[a].append(b)
            near[b].append(a)
    ranks = sorted(layers)
    for sweep in range(8):
        down = sweep % 2 == 0
        for rank in ranks if down else reversed(ranks):
            side = rank - 1 if down else rank + 1
            for node in layers[rank]:
                around = sorted(nodes[m].order for m in near[node.name] if nodes[m].rank == side)
                if around:
                    node.order = around[len(around) // 2] if len(around) % 2 else sum(around) / len(around)
            for i, node in enumerate(sorted(layers[rank], key=lambda n: n.order)):
                node.order = float(i)


def _place(nodes: dict[str, Node]) -> tuple[float, float]:
    layers: dict[int, list[Node]] = {}
    for node in nodes.values():
        node.width = WAYPOINT_WIDTH if node.waypoint else max(96.0, len(node.label) * CHAR_WIDTH + 28)
        layers.setdefault(node.rank, []).append(node)
    widths = {r: sum(n.width for n in layer) + NODE_GAP * (len(layer) - 1) for r, layer in layers.items()}
    widest = max(widths.values(), default=0.0)
    for rank, layer in layers.items():
        x = MARGIN + (widest - widths[rank]) / 2
        for node in sorted(layer, key=lambda n: n.order):
            node.x, node.y = x, MARGIN + rank * (NODE_HEIGHT + LAYER_GAP)
            x += node.width + NODE_GAP
    height = MARGIN * 2 + (max(layers, default=0) + 1) * (NODE_HEIGHT + LAYER_GAP) - LAYER_GAP
    return widest + MARGIN * 2 + 40, height  # room on the right for loops


def _ports(nodes: dict[str, Node], edges: list[Edge]) -> None:
    """Spread the lines that leave a state's bottom (or enter its top) along it, in the order of where they go,
    so that lines into one state do not arrive on one point."""
    bottoms: dict[str, list[tuple[float, Edge]]] = {}
    tops: dict[str, list[tuple[float, Edge]]] = {}
    for e in edges:
        if e.source == e.target:
            continue
        chain = _chain(e)
        bottoms.setdefault(chain[0], []).append((nodes[chain[1]].centre, e))
        tops.setdefault(chain[-1], []).append((nodes[chain[-2]].centre, e))
    for side, attach in ((bottoms, "top_x"), (tops, "bottom_x")):
        for name, ends in side.items():
            node = nodes[name]
            ends.sort(key=lambda t: t[0])
            span = node.width * 0.6
            for i, (_, e) in enumerate(ends):
                x = node.centre if len(ends) == 1 else node.centre - span / 2 + span * i / (len(ends) - 1)
                setattr(e, attach, x)


def svg(route: Route, title: str) -> Markup:
    """The drawing as inline SVG: classes for the stylesheet (visited, current, taken), presentation attributes
    so it still reads without it, and a title and description for screen readers."""
    parts: list[str] = []
    add = parts.append
    described = ", ".join(f"{n.name}{' (current)' if n.current else ''}" for n in route.states() if n.visited)
    add(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="route" viewBox="0 0 {route.width:.0f} {route.height:.0f}" '
        f'width="{route.width:.0f}" height="{route.height:.0f}" role="img" '
        f'aria-labelledby="route-title route-desc">'
    )
    add(f'<title id="route-title">{escape(title)}</title>')
    add(f'<desc id="route-desc">States the task has been in: {escape(described)}.</desc>')
    add("<defs>")
    for marker, colour in (("arrow", "#555"), ("arrow-taken", "#1d4ed8")):
        add(
            f'<marker id="{marker}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" markerHeight="9" '
            f'markerUnits="userSpaceOnUse" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
            f'fill="{colour}"/></marker>'
        )
    add("</defs>")
    placed: list[tuple[float, float, float, float]] = [
        (n.x, n.y, n.x + n.width, n.y + NODE_HEIGHT) for n in route.states()
    ]  # labels go where no state and no other label is
    for edge in sorted(route.edges, key=lambda e: e.taken == 0):  # the route's labels first, its lines on top
        parts.insert(len(parts) if edge.taken == 0 else _after_defs(parts), _edge(route, edge, placed))
    for node in route.states():
        add(_node(node))
    add("</svg>")
    return Markup("".join(parts))


def _after_defs(parts: list[str]) -> int:
    return parts.index("</defs>") + 1


def _bezier(p0: tuple[float, float], p1: tuple[float, float], t: float) -> tuple[float, float]:
    """A point of the segment `_edge` draws from p0 to p1 (vertical tangents at both ends)."""
    bend = (p1[1] - p0[1]) / 2
    c0, c1 = (p0[0], p0[1] + bend), (p1[0], p1[1] - bend)
    u = 1 - t
    x = u**3 * p0[0] + 3 * u * u * t * c0[0] + 3 * u * t * t * c1[0] + t**3 * p1[0]
    y = u**3 * p0[1] + 3 * u * u * t * c0[1] + 3 * u * t * t * c1[1] + t**3 * p1[1]
    return x, y


def _free(box: tuple[float, float, float, float], placed: list[tuple[float, float, float, float]]) -> bool:
    x0, y0, x1, y1 = box
    return all(x1 < a or x0 > c or y1 < b or y0 > d for a, b, c, d in placed)


def _edge(route: Route, edge: Edge, placed: list[tuple[float, float, float, float]]) -> str:
    taken = edge.taken > 0
    colour = "#1d4ed8" if taken else "#6b6b6b"
    label = ", ".join(edge.triggers[:2]) + (" …" if len(edge.triggers) > 2 else "")
    if taken:
        label += f" \u00d7{edge.taken}"  # the multiplication sign: "taken 2 times"
    wide = len(label) * LABEL_CHAR_WIDTH
    nodes = route.nodes
    if edge.source == edge.target:  # a trigger that stays in the state: a loop on its right, or left if crowded
        node = nodes[edge.source]
        right = node.x + node.width
        crowded = any(n.rank == node.rank and n is not node and right <= n.x < right + 60 for n in route.nodes.values())
        x, out = (node.x, -36) if crowded else (right, 36)
        y = node.y + NODE_HEIGHT / 2
        d = f"M{x:.1f},{y - 9:.1f} C{x + out:.1f},{y - 24:.1f} {x + out:.1f},{y + 24:.1f} {x:.1f},{y + 9:.1f}"
        spots = [(x + out - (wide if crowded else 0), y - 22), (x + out - (wide if crowded else 0), y + 30)]
    else:
        chain = _chain(edge)
        top, bottom = nodes[chain[0]], nodes[chain[-1]]
        points = [(edge.top_x, top.y + NODE_HEIGHT)]
        points += [(nodes[w].centre, nodes[w].y + NODE_HEIGHT / 2) for w in chain[1:-1]]
        points.append((edge.bottom_x, bottom.y))
        if edge.upward:
            points.reverse()
        d = f"M{points[0][0]:.1f},{points[0][1]:.1f}"
        for (x1, y1), (x2, y2) in itertools.pairwise(points):
            bend = (y2 - y1) / 2
            d += f" C{x1:.1f},{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} {x2:.1f},{y2:.1f}"
        segments = list(itertools.pairwise(points))
        spots = [_bezier(a, b, t) for a, b in segments for t in (0.5, 0.3, 0.7, 0.15, 0.85)]
    # The first spot along the line where the label covers no state and no other label; else the first.
    boxes = [(x + 4, y - 10, x + 4 + wide, y + 3) for x, y in spots]
    box = next((b for b in boxes if _free(b, placed)), boxes[0])
    placed.append(box)
    css = "edge taken" if taken else "edge"
    marker = "url(#arrow-taken)" if taken else "url(#arrow)"
    width = 2.5 if taken else 1.2
    return (
        f'<g class="{css}"><path d="{d}" fill="none" stroke="{colour}" stroke-width="{width}" '
        f'marker-end="{marker}"/><text x="{box[0]:.1f}" y="{box[3] - 3:.1f}" class="edge-label" font-size="11" '
        f'fill="{colour}" stroke="#fff" stroke-width="3" paint-order="stroke">'
        f"{escape(label)}</text></g>"
    )


def _node(node: Node) -> str:
    classes = ["node", f"kind-{node.kind}"]
    if node.visited:
        classes.append("visited")
    if node.current:
        classes.append("current")
    fill = "#fde68a" if node.current else "#dbeafe" if node.visited else "#ffffff"
    stroke = "#92400e" if node.current else "#1d4ed8" if node.visited else "#666"
    radius = 18 if node.kind == str(StateKind.TERMINAL) else 6
    current = ' aria-current="step"' if node.current else ""
    return (
        f'<g class="{" ".join(classes)}" data-state="{escape(node.name)}"{current}>'
        f'<rect x="{node.x:.1f}" y="{node.y:.1f}" width="{node.width:.1f}" height="{NODE_HEIGHT}" '
        f'rx="{radius}" fill="{fill}" stroke="{stroke}" stroke-width="{2.5 if node.current else 1.5}"/>'
        f'<text x="{node.centre:.1f}" y="{node.y + NODE_HEIGHT / 2 + 4.5:.1f}" font-size="13" '
        f'text-anchor="middle" fill="#111">{escape(node.label)}</text></g>'
    )


@dataclass(frozen=True, slots=True)
class Visit:
    """One stay in a state, as the page's route lists it: the state (internal ones folded in), the trigger that
    led there and the seq of that event."""

    state: str
    trigger: str
    seq: int


def visits_of(events: Iterable[Event], *, internal: bool = False) -> list[Visit]:
    """The states the task went through, in order; a step into a state's own internal state (a repair, a
    provider error) is part of the stay in that state, not a stay of its own."""
    name = (lambda s: s) if internal else public_name
    out: list[Visit] = []
    for event in events:
        state = name(event.to_state)
        if out and out[-1].state == state and event.from_state is not None and name(event.from_state) == state:
            if event.to_state == state and event.from_state == state:
                out.append(Visit(state, event.trigger, event.seq))  # a trigger that stays: the note is a step
            continue
        out.append(Visit(state, event.trigger, event.seq))
    return out


def task_route(definition: Workflow, events: Sequence[Event], *, internal: bool = False) -> Markup:
    """The task's route drawn on its workflow version."""
    visits, current = path_visits(events)
    return svg(layout(definition, visits, current, internal=internal), f"Route of the task on {definition.ref}")
