"""Railyard's reference workflows: the repository's, for `make demo`, the tests and the docs; not installed.

In the repository's root they are the working directory's `workflows` package, which an unset
`RAILYARD_WORKFLOWS` loads; `railyard demo` loads them explicitly.

`workflows.fakes` holds fakes of the systems they call (orders, payments, tickets).
"""

from workflows.expense import EXPENSE
from workflows.order_review import ORDER_CHECK, ORDER_REVIEW
from workflows.refund import REFUND_V1, REFUND_V2
from workflows.ticket_triage import TICKET_TRIAGE, TICKET_TRIAGE_V2

__all__ = ["EXPENSE", "ORDER_CHECK", "ORDER_REVIEW", "REFUND_V1", "REFUND_V2", "TICKET_TRIAGE", "TICKET_TRIAGE_V2"]
