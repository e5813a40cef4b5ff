"""Compile a workflow's shape into a `transitions` machine, once per version.

The machine holds the structure (states, triggers, sources, destinations) and
draws the diagrams. It has no model attached: a task's current state is the
fold of its events, never a live object, so one machine serves every task of
that version. The runtime asks it which triggers a state allows.

It is compiled from a `Shape`, plain data the definition gives it
(`Workflow.machine`), not from the definition itself: the definitions depend
on the machine, never the other way round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from transitions import Machine

GraphFormat = Literal["mermaid", "dot"]
#: Built-in triggers left off diagrams unless a task took them (see `graph`).
UNDRAWN = frozenset({"cancel_requested", "settle"})


@dataclass(frozen=True)
class Shape:
    """What a machine is compiled from: a version's name (`refund@2`), its states in order, its first state, each
    transition as (source, trigger, target) in the definition's order, the (source, trigger) pairs any signed-in
    person may fire, and each child state's child workflow (name, version; None: the newest at the start)."""

    ref: str
    states: Sequence[str]
    initial: str
    edges: Sequence[tuple[str, str, str]]
    anyone: frozenset[tuple[str, str]] = frozenset()
    children: Mapping[str, tuple[str, int | None]] = field(default_factory=dict)


class CompiledMachine:
    """A definition's shared `transitions.Machine` plus the per-state trigger lists read from it."""

    def __init__(self, shape: Shape) -> None:
        self._shape = shape
        self._states = list(shape.states)
        self._transitions = [
            {"trigger": trigger, "source": source, "dest": dest} for source, trigger, dest in shape.edges
        ]
        self._anyone = shape.anyone
        self.machine = Machine(
            model=None,
            states=self._states,
            transitions=self._transitions,
            initial=shape.initial,
            auto_transitions=False,
            send_event=True,
        )
        # The machine answers which triggers a state has; the definition's order is kept for display.
        declared = list(dict.fromkeys((t["source"], t["trigger"]) for t in self._transitions))
        self._triggers: Mapping[str, list[str]] = {
            state: [t for s, t in declared if s == state and t in set(self.machine.get_triggers(state))]
            for state in self._states
        }

    def triggers(self, state: str) -> list[str]:
        return self._triggers.get(state, [])

    def destinations(self, state: str, trigger: str) -> list[str]:
        return [str(t.dest) for t in self.machine.get_transitions(trigger=trigger, source=state)]

    def child_workflows(self) -> dict[str, tuple[str, int | None]]:
        """Each child state's child workflow: state name -> (workflow name, version; None: the newest at the start).
        What the diagrams draw on a child state, and what the pages link to (`/workflows/NAME`)."""
        return dict(self._shape.children)

    def _label(self, state: str) -> str | None:
        """A child state's label on the diagrams: its name and the workflow it starts (`claim_refund: refund@2`)."""
        child = self.child_workflows().get(state)
        if child is None:
            return None
        name, version = child
        return f"{state}: child {name}@{version if version is not None else 'newest'}"

    def graph(
        self,
        fmt: GraphFormat = "mermaid",
        *,
        current: str | None = None,
        visits: Mapping[tuple[str, str, str], int] | None = None,
    ) -> str:
        """The diagram source, drawn by transitions' diagram support (Mermaid, or Graphviz dot).

        `visits` counts how often a task took each (source, trigger, target) edge:
        those edges are labelled with their count and, with the states they touch,
        drawn in the diagrams' "previous" style, so a task's route stands out.
        """
        from transitions.core import State
        from transitions.extensions.diagrams import GraphMachine

        class _Marker:
            """A throwaway model: diagrams highlight the state a model is in."""

        taken = visits or {}
        transitions = [
            {**t, "label": f"{t['trigger']} ({taken[edge]}x)"}
            if (edge := (t["source"], t["trigger"], t["dest"])) in taken
            else t
            for t in self._transitions
            # A cancel request and an operator's settlement are notes any state may take while a write is open:
            # drawn on every state they would bury the route; where they lead (cancelled) is drawn already.
            if t["trigger"] not in UNDRAWN or (t["source"], t["trigger"], t["dest"]) in taken
        ]
        # A trigger any signed-in person may fire says so on its edge: deny by default is the rule, this the exception.
        transitions = [
            {**t, "label": f"{t.get('label', t['trigger'])} [anyone]"}
            if (t["source"], t["trigger"]) in self._anyone
            else t
            for t in transitions
        ]
        engine: Literal["mermaid", "graphviz"] = "mermaid" if fmt == "mermaid" else "graphviz"

        class _Labelled(State):
            """A state drawn under a label of its own (transitions' diagrams read a state's `label`)."""

            def __init__(self, *args: Any, label: str | None = None, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                if label:
                    self.label = label

        class _Drawing(GraphMachine):
            state_cls = _Labelled

        gm = _Drawing(
            model=_Marker(),
            states=[{"name": s, "label": label} if (label := self._label(s)) else s for s in self._states],
            transitions=transitions,
            initial=self._shape.initial,
            auto_transitions=False,
            graph_engine=engine,
            title=self._shape.ref,
            show_conditions=False,
        )
        if current is not None and current != self._shape.initial:
            gm.set_state(current)
        graph = gm.get_graph(force_new=True)
        if taken:
            # transitions' typed diagram API (GraphMachine.model_graphs, BaseGraph.set_previous_transition and
            # set_node_style, GraphMachine.style_attributes): the calls its own transitions make as a model moves
            # along an edge, made for every taken edge, since a moving model keeps only its last one styled.
            drawing = gm.model_graphs[id(gm.model)]
            for source, _trigger, dest in taken:
                drawing.set_previous_transition(source, dest)
                for state in (source, dest):
                    if state != current and state in self._states:
                        drawing.set_node_style(state, "previous")
            edges = gm.style_attributes["edge"]
            assert isinstance(edges, dict)
            gm.style_attributes = {
                **gm.style_attributes,
                "edge": {**edges, "previous": {"color": "blue", "fontcolor": "blue", "penwidth": "2"}},
            }
            graph = gm.get_graph()
        if fmt == "mermaid":
            return str(graph.draw(None))
        return str(graph.source)


def compile_machine(shape: Shape) -> CompiledMachine:
    return CompiledMachine(shape)
