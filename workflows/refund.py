"""`refund@1` and `refund@2`: a customer's refund, found by an agent, approved by a human, paid exactly once.

The agent looks the order up, asks the customer for more if it must, assesses
eligibility and proposes a refund; the guards hold the proposal to the order
as looked up (the customer's own order, within its refundable balance, in its
currency, with evidence that exists). A `refund_approver` who neither started
the task nor proposed the refund approves the prepared call within 48 hours,
and the payment provider is asked once per action id: a reply lost after the
provider paid is settled by asking it what became of that action id.

refund@2 is refund@1 plus one rule, to show versioning: a refund of more than
half the order total must name a reason category other than goodwill. Both
versions have the same states, so tasks in flight on @1 can be moved to @2.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field

from engine import (
    Action,
    Agent,
    Approval,
    CardField,
    DecisionCard,
    Guard,
    Labels,
    Restricted,
    Terminal,
    Tool,
    ToolCatalog,
    Wait,
    Workflow,
)
from workflows.refund_rules import (
    ASSESSMENT_GUARDS,
    PROPOSAL_GUARDS,
    large_refunds_name_a_category,
    no_payment_attempted,
)
from workflows.refund_tools import (
    ORDER_ID,
    REFUND_TOOLS_V1,
    REFUND_TOOLS_V2,
    CategorisedRefundRequest,
    EvidenceId,
    OrderQuery,
    RefundRequest,
)

APPROVER = "refund_approver"
#: Who runs refunds that stopped: retries a failed payment, sends a task back, settles, cancels, and may do the
#: agent's work by hand (the event then says they stood in for the model). Never the approver's role: separation
#: of duties holds between whoever proposes a refund and whoever approves it.
OPERATOR = "refund_operator"
#: The role of the system that relays the customer's answers (the customer portal).
PORTAL = "customer_portal"
APPROVAL_DEADLINE = timedelta(hours=48)
CUSTOMER_DEADLINE = timedelta(days=7)


class RefundInput(BaseModel):
    """Who asks and what: set by the trusted caller that starts the task, never by the model."""

    model_config = ConfigDict(extra="forbid")
    customer_id: str = Field(pattern=r"^C-\d{3,6}$")
    message: str = Field(min_length=1, max_length=2000, description="The customer's request, in their words.")
    order_id: str | None = Field(default=None, pattern=ORDER_ID, description="The order the customer named.")


class InfoRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1, max_length=500, description="What the customer should tell or send us.")


class Assessment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order_id: str = Field(pattern=ORDER_ID)
    finding: str = Field(min_length=1, max_length=500, description="Why the order is eligible for a refund.")


class Rejection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=300)


class Acknowledgement(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str = Field(min_length=1, max_length=500, description="What was done about it (the customer told, ...).")


class CustomerReply(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message: str = Field(min_length=1, max_length=2000)
    evidence_ids: list[EvidenceId] = Field(default_factory=list, max_length=10)


#: What a person deciding is shown first in each human state: the refund, the customer and their words, and the
#: order as it was looked up (its balance in money, read at the time the card says).
AMOUNT = CardField("amount", "prepared.amount", "refund", "money", currency="prepared.currency")
CUSTOMER = CardField("customer", "input.customer_id", "customer")
ORDER = CardField("order", "prepared.order_id", "order")
MESSAGE = CardField("message", "input.message", "the customer's message", section="inputs")
LOOKED_UP = "facts.tool:query_order"
BALANCE = (
    CardField("total", f"{LOOKED_UP}.total", "order total", "money", f"{LOOKED_UP}.currency", "evidence"),
    CardField("refunded", f"{LOOKED_UP}.refunded", "refunded so far", "money", f"{LOOKED_UP}.currency", "evidence"),
    CardField(
        "refundable", f"{LOOKED_UP}.refundable", "still refundable", "money", f"{LOOKED_UP}.currency", "evidence"
    ),
    CardField("status", f"{LOOKED_UP}.status", "order status", section="evidence"),
)
REFUND_CARDS = {
    "awaiting_approval": DecisionCard(
        "Refund {amount} to {customer} for order {order}",
        (AMOUNT, CUSTOMER, ORDER, CardField("reason", "prepared.reason", "reason given"), MESSAGE, *BALANCE),
    ),
    "retryable_failure": DecisionCard(
        "The refund of {amount} to {customer} did not go through", (AMOUNT, CUSTOMER, ORDER, MESSAGE, *BALANCE)
    ),
    "paid_after_cancel": DecisionCard(
        "{amount} was paid to {customer} although the task was cancelled", (AMOUNT, CUSTOMER, ORDER, MESSAGE)
    ),
    "needs_human": DecisionCard(
        "{customer} asked for a refund: a person takes over",
        (CUSTOMER, CardField("named", "input.order_id", "order named"), MESSAGE, *BALANCE),
    ),
}


#: The words the back office shows for refund's states, actions, codes and fields (`Labels`: not in the digest).
REFUND_LABELS = Labels(
    states={
        "collecting_information": "Finding the order",
        "looking_up_order": "Looking up the order",
        "awaiting_customer": "Waiting for the customer",
        "eligible": "Proposing a refund",
        "awaiting_approval": "Waiting for approval",
        "executing": "Paying the refund",
        "retryable_failure": "Payment failed",
        "needs_human": "Needs a person",
        "paid_after_cancel": "Paid despite a cancel",
        "completed": "Refunded",
        "rejected": "No refund",
        "cancelled": "Cancelled",
        "limit_exceeded": "Out of budget",
    },
    actions={
        "query_order": "Look up the order",
        "assess_eligibility": "Assess eligibility",
        "request_more_info": "Ask the customer",
        "customer_replied": "Customer replied",
        "propose_refund": "Propose a refund",
        "approve": "Approve the refund",
        "reject": "Reject",
        "retry_refund": "Retry the payment",
        "give_up": "Give up on paying",
        "reopen": "Reopen",
        "close": "Close without a refund",
        "acknowledge": "Acknowledge",
        "cancel": "Cancel the task",
    },
    codes={
        "TOOL_REMOTE_ERROR": "The payment provider refused the payment",
        "TOOL_TIMEOUT": "The payment provider did not answer in time",
        "OUTCOME_UNKNOWN": "Whether the payment went out is not known",
    },
    fields={
        "order_id": "Order",
        "customer_id": "Customer",
        "amount": "Amount",
        "currency": "Currency",
        "reason": "Reason",
        "message": "Customer's message",
        "refund_id": "Refund reference",
        "evidence_ids": "Evidence",
    },
)


def _refund_workflow(
    version: int, tools: ToolCatalog, request: type[RefundRequest], guards: Sequence[Guard], note: str
) -> Workflow:
    return Workflow(
        name="refund",
        version=version,
        description="Refund a customer's order: find it, check it, propose a refund, get it approved, pay it. " + note,
        input=RefundInput,
        searchable=("customer_id", "order_id"),
        cards=REFUND_CARDS,
        labels=REFUND_LABELS,
        tools=tools,
        # A cancel that arrives while the payment is in flight waits for its outcome; if the money went out, a
        # refund approver sees it here instead of the task quietly ending `cancelled`.
        effect_after_cancel="paid_after_cancel",
        operator_role=OPERATOR,
        model_override_role=OPERATOR,
        # The customer's own words and the payment provider's reference are for the people who decide and run
        # refunds (and auditors): the customer portal, which reads refunds to relay answers, is shown neither.
        restricted=Restricted(roles=(APPROVER, OPERATOR), input=("message",), results=("payments_refund.refund_id",)),
        states=[
            Agent(
                "collecting_information",
                description="Find the order the customer means and decide whether a refund can be considered.",
                on_exhausted="needs_human",
                actions=[
                    Action(
                        "query_order",
                        "looking_up_order",
                        OrderQuery,
                        prepares="query_order",
                        description="Look an order up (read-only).",
                    ),
                    Action(
                        "request_more_info",
                        "awaiting_customer",
                        InfoRequest,
                        description="Ask the customer for what is missing (an order id, a photo).",
                    ),
                    Action(
                        "assess_eligibility",
                        "eligible",
                        Assessment,
                        guards=ASSESSMENT_GUARDS,
                        description="The looked-up order of this customer may be refunded: go on to propose.",
                    ),
                ],
            ),
            Tool(
                "looking_up_order",
                tool="query_order",
                on_succeeded="collecting_information",
                on_failed="collecting_information",
                on_unknown="collecting_information",
            ),
            Wait(
                "awaiting_customer",
                description="Waiting for the customer's answer, relayed by the portal.",
                deadline=CUSTOMER_DEADLINE,
                on_expired="needs_human",
                actions=[Action("customer_replied", "collecting_information", CustomerReply, role=PORTAL)],
            ),
            Agent(
                "eligible",
                description="Propose the refund for a human to approve, or reject the request.",
                on_exhausted="needs_human",
                actions=[
                    Action(
                        "propose_refund",
                        "awaiting_approval",
                        request,
                        guards=guards,
                        prepares="payments_refund",
                        description="Propose a refund of the looked-up order, in its currency, in minor units.",
                    ),
                    Action("reject", "rejected", Rejection, description="The request does not qualify."),
                ],
            ),
            Approval(
                "awaiting_approval",
                role=APPROVER,
                deadline=APPROVAL_DEADLINE,
                on_expired="needs_human",
                description="A refund approver checks the prepared refund.",
                actions=[Action("approve", "executing"), Action("reject", "rejected", Rejection)],
            ),
            Tool(
                "executing",
                tool="payments_refund",
                on_succeeded="completed",
                on_failed="retryable_failure",
                on_unknown="retryable_failure",
            ),
            Wait(
                "retryable_failure",
                description="The provider refused the refund, or its answer was lost. Retrying sends the same "
                "action id, which the provider never pays twice.",
                actions=[
                    Action("retry_refund", "executing", role=OPERATOR),
                    Action("give_up", "needs_human", role=OPERATOR),
                ],
            ),
            Wait(
                "needs_human",
                description="A person takes over: the agent gave up, or nobody approved in time.",
                actions=[
                    Action("reopen", "collecting_information", guards=[no_payment_attempted], role=OPERATOR),
                    Action("close", "rejected", Rejection, role=OPERATOR),
                ],
            ),
            Wait(
                "paid_after_cancel",
                description="The task was cancelled while the payment was in flight, and the provider paid: the "
                "outcome event names the action id and the amount. Tell the customer, then close it.",
                actions=[Action("acknowledge", "completed", Acknowledgement, role=OPERATOR)],
            ),
            Terminal("completed", description="The refund was paid."),
            Terminal("rejected", description="No refund."),
        ],
    )


REFUND_V1 = _refund_workflow(1, REFUND_TOOLS_V1, RefundRequest, PROPOSAL_GUARDS, "")
REFUND_V2 = _refund_workflow(
    2,
    REFUND_TOOLS_V2,
    CategorisedRefundRequest,
    (*PROPOSAL_GUARDS, large_refunds_name_a_category),
    "A refund of more than half the order total must name its category (damaged, not_delivered, wrong_item).",
)
