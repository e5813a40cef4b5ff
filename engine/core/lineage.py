"""What a child task's row carries of its parent, so lists and the work queue name the chain without a log.

A child's first event names its parent (`engine.core.children`), but the work queue reads rows, never logs
(`Store.queue_page`). So a child is created with three searchable fields of its own (names starting with `~`,
which no workflow's input field can have, as `engine.core.forks.FORKED_FROM`): the parent's task id, its
workflow's name, and a human handle of it: the parent's first searchable field that holds a value (a ticket id),
else its short task id. The queue then says "refund for ticket triage T-5001". A search by the parent's id
finds its children. The fields are presentation, written once with the child; the log stays the record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: The parent's task id, on a child's row.
PARENT = "~parent"
#: The parent's workflow name, on a child's row.
PARENT_WORKFLOW = "~parent_workflow"
#: The parent's human handle (its first searchable field with a value, else its short id), on a child's row.
PARENT_HANDLE = "~parent_handle"
CHAIN_FIELDS = frozenset({PARENT, PARENT_WORKFLOW, PARENT_HANDLE})


def handle(parent_id: str, searchable: Sequence[str], parent_fields: Mapping[str, str]) -> str:
    """How a person calls the parent: its first declared searchable field with a value (in declaration order),
    else the first 8 characters of its id."""
    return next((parent_fields[n] for n in searchable if parent_fields.get(n)), parent_id[:8])


def chain_fields(parent_id: str, parent_workflow: str, parent_handle: str) -> dict[str, str]:
    """The fields a child is created with: what its queue row says of its parent."""
    return {PARENT: parent_id, PARENT_WORKFLOW: parent_workflow, PARENT_HANDLE: parent_handle}


@dataclass(frozen=True, slots=True)
class Chain:
    """A child's parent as its row names it."""

    task_id: str
    workflow: str
    handle: str

    def __str__(self) -> str:
        """`ticket triage T-5001`."""
        return f"{self.workflow.replace('_', ' ')} {self.handle}"


def chain_of(fields: Mapping[str, str]) -> Chain | None:
    """The parent a row's fields name (None: the task is no child, or predates these fields)."""
    parent = fields.get(PARENT)
    if not parent:
        return None
    return Chain(parent, fields.get(PARENT_WORKFLOW, ""), fields.get(PARENT_HANDLE) or parent[:8])


def declared(fields: Mapping[str, str]) -> dict[str, str]:
    """The fields a workflow declares, without the chain's: what a row shows as the task's own."""
    return {k: v for k, v in fields.items() if k not in CHAIN_FIELDS}
