"""Reference workflows shipped with Railyard; `RAILYARD_WORKFLOWS` defaults to this package.

`workflows.fakes` holds fakes of the systems they call (orders, payments, tickets).
"""

from workflows.expense import EXPENSE
from workflows.refund import REFUND_V1, REFUND_V2
from workflows.ticket_triage import TICKET_TRIAGE

__all__ = ["EXPENSE", "REFUND_V1", "REFUND_V2", "TICKET_TRIAGE"]
