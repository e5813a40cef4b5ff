"""A property of refund@1, on SQLite and PostgreSQL: whatever a model proposes and whoever acts, no refund is
ever paid without an approval by a different user holding `refund_approver`, never above the order's
refundable balance, never twice.

Hypothesis draws a customer, a starter and a sequence of moves: model turns
within and outside the rules (lookups of any order, proposals of any amount,
currency and evidence, prose, identity overrides, calls of tools that are not
actions), approvals and rejections by anyone through both paths, deadlines,
retries, hand-offs, payment-provider failures. The check reads only the
payment provider's books and the task's log, and checks the roles against
this test's own table, not the engine's answer.
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Engine, RailyardError, ScriptedModel, verify_chain
from engine.providers.scripted import call
from tests.support.payloads import undeclared
from tests.support.reference import ROLES, fake_systems, reference_engine
from workflows import fakes
from workflows.fakes.seed import EVIDENCE, ORDERS

EXAMPLES = 120
ACTORS = ["ann", "dana", "erin", "olga", "bob", "model:scripted:scripted"]
APPROVERS = {actor for actor, roles in ROLES.items() if "refund_approver" in roles}
REFUNDABLE = {o["order_id"]: o["total"] - o["refunded"] for o in ORDERS}
CURRENCY = {o["order_id"]: o["currency"] for o in ORDERS}
ORDER_IDS = [*REFUNDABLE, "O-9999"]
#: What the provider refuses on its own. The workflow must never let such a request reach it.
MUST_NOT_REACH = {"over_balance", "currency", "no_order", "amount", "key_reused"}

order_ids = st.sampled_from(ORDER_IDS)


@st.composite
def proposals(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly plausible, often wrong: any order, amounts around the balances, other currencies, unknown evidence."""
    order_id = draw(order_ids)
    balance = REFUNDABLE.get(order_id, 1_000)
    amount = draw(
        st.one_of(st.integers(1, max(balance, 1)), st.integers(-10, 40_000), st.sampled_from([0, balance, balance + 1]))
    )
    currency = draw(st.one_of(st.just(CURRENCY.get(order_id, "EUR")), st.sampled_from(["EUR", "USD", "GBP", "eur"])))
    evidence = draw(st.lists(st.sampled_from(["EV-1", "EV-2", "EV-3", "EV-4", "EV-99"]), max_size=11))
    return call(
        "propose_refund", order_id=order_id, amount=amount, currency=currency, reason="Damaged.", evidence_ids=evidence
    )


turns = st.one_of(
    order_ids.map(lambda o: call("query_order", order_id=o)),
    order_ids.map(lambda o: call("assess_eligibility", order_id=o, finding="Looks eligible.")),
    proposals(),
    proposals(),
    st.just(call("reject", reason="Not eligible.")),
    st.just(call("request_more_info", question="Which order?")),
    st.just({"text": "I will refund the customer in full right away."}),
    proposals().map(
        lambda p: {
            "tool_calls": [
                {**p["tool_calls"][0], "arguments": {**p["tool_calls"][0]["arguments"], "customer_id": "C-200"}}
            ]
        }
    ),
    proposals().map(lambda p: {"tool_calls": [{**p["tool_calls"][0], "name": "payments_refund"}]}),
    st.tuples(proposals(), proposals()).map(
        lambda ps: {"tool_calls": [ps[0]["tool_calls"][0], ps[1]["tool_calls"][0]]}
    ),
)

actors = st.sampled_from(ACTORS)
moves = st.lists(
    st.one_of(
        st.tuples(st.just("model"), st.lists(turns, min_size=1, max_size=6)),
        st.tuples(st.just("approve"), actors, st.booleans()),
        st.tuples(st.just("fire"), st.sampled_from(["approve", "retry_refund", "give_up", "reopen", "close"]), actors),
        st.tuples(st.just("reject"), actors),
        st.tuples(st.just("expire")),
        st.tuples(st.just("fault"), st.sampled_from(["lost_reply", "remote_error", "unavailable"])),
        st.tuples(st.just("reply"), st.lists(st.sampled_from(["EV-1", "EV-3", "EV-77"]), max_size=2)),
        st.tuples(st.just("run")),
        st.tuples(st.just("cancel"), actors),
    ),
    max_size=8,
)


@st.composite
def stories(draw: st.DrawFn) -> tuple[str, list[tuple[Any, ...]]]:
    """A refund that could go through (look up, assess, propose, approve, pay, maybe retry), with random moves
    slipped in anywhere: random moves alone would almost never reach a payment, and a property never put to
    the test proves nothing. Before its valid proposal the model often tries one that breaks a rule."""
    customer = draw(st.sampled_from(["C-100", "C-200"]))
    own = [o["order_id"] for o in ORDERS if o["customer_id"] == customer]
    order_id = draw(st.one_of(st.sampled_from(own), order_ids))
    balance, currency = REFUNDABLE.get(order_id, 1), CURRENCY.get(order_id, "EUR")
    evidence = [e["evidence_id"] for e in EVIDENCE if e["order_id"] == order_id]
    valid = {
        "order_id": order_id,
        "amount": draw(st.integers(1, balance)),
        "currency": currency,
        "reason": "Damaged in transit.",
        "evidence_ids": draw(st.lists(st.sampled_from(evidence), max_size=2)) if evidence else [],
    }
    tempting = draw(
        st.sampled_from(
            [
                {},
                {"amount": balance + 1},
                {"amount": 2 * balance + 500},
                {"amount": 0},
                {"currency": "USD" if currency != "USD" else "EUR"},
                {"evidence_ids": ["EV-99"]},
            ]
        )
    )
    approve_via = draw(st.sampled_from(["approve", "fire"]))
    approver = draw(st.sampled_from(["dana", "dana", "erin", "ann", "bob"]))  # dana also starts half the tasks
    first_approval = (
        ("approve", approver, draw(st.booleans())) if approve_via == "approve" else ("fire", "approve", approver)
    )
    story: list[tuple[Any, ...]] = [
        (
            "model",
            [
                call("query_order", order_id=order_id),
                call("assess_eligibility", order_id=order_id, finding="Damaged."),
                *draw(st.lists(turns, max_size=2)),
                call("propose_refund", **{**valid, **tempting}),
                call("propose_refund", **valid),
            ],
        ),
        *draw(st.sampled_from([[], [], [], [("expire",)]])),  # sometimes nobody approves in time
        first_approval,
        ("approve", draw(st.sampled_from(sorted(APPROVERS))), draw(st.sampled_from([True, True, False]))),
        *draw(
            st.lists(
                st.tuples(st.just("fault"), st.sampled_from(["lost_reply", "remote_error", "unavailable"])), max_size=1
            )
        ),
        ("run",),
        ("fire", "retry_refund", draw(st.sampled_from(["olga", "otto", "dana", "bob"]))),
        ("run",),
    ]
    for move in draw(moves):
        story.insert(draw(st.integers(0, len(story))), move)
    return customer, story


def apply(eng: Engine, books: fakes.Systems, task_id: str, move: tuple[Any, ...], seen: Counter[str]) -> None:
    kind = move[0]
    try:
        if kind == "model":
            task = eng.load(task_id)
            if task.state.endswith("~provider_error"):  # an operator sends it back to the model
                eng.fire(task_id, "retry", actor="olga")
            eng.run(task_id, model=ScriptedModel(list(move[1]), profile="anthropic"), max_turns=2 * len(move[1]))
        elif kind == "approve":
            prepared = eng.load(task_id).prepared
            digest = prepared["digest"] if prepared and move[2] else "0" * 64
            eng.approve(task_id, actor=move[1], prepared_digest=digest)
        elif kind == "fire":
            payload = {"reason": "Closed."} if move[1] == "close" else None
            eng.fire(task_id, move[1], payload, actor=move[2])
        elif kind == "reject":
            eng.reject(task_id, actor=move[1], reason="No.")
        elif kind == "expire":
            eng.transition(eng.load(task_id), "expired", actor="system:timer", system=True)
        elif kind == "fault":
            books.arm("payments.refund", move[1])
        elif kind == "reply":
            eng.fire(task_id, "customer_replied", {"message": "Here.", "evidence_ids": move[1]}, actor="portal")
        elif kind == "run":
            eng.run(task_id, model=ScriptedModel([], profile="anthropic"), max_turns=3)
        elif kind == "cancel":
            eng.cancel(task_id, actor=move[1], reason="Customer withdrew.")
        seen[f"ok:{kind}"] += 1
    except RailyardError as refusal:
        seen[f"refused:{kind}:{refusal.code}"] += 1


def check(eng: Engine, books: fakes.Systems, task_id: str, seen: Counter[str]) -> None:
    events = eng.history(task_id)
    assert verify_chain(events) == []
    assert undeclared(events) == []  # every key of every step is one the event reference declares
    started_by = events[0].actor
    requests = books.payments.requests()
    for request in requests:
        assert request["detail"] not in MUST_NOT_REACH, request
        if request["result"] != "executed":
            continue
        seen["paid"] += 1
        key = request["idempotency_key"]
        # The refund paid is a prepared call this task recorded, by a proposal, for exactly this amount and order.
        proposal = next(e for e in events if (call := e.data.get("prepared")) and call["action_id"] == key)
        arguments = proposal.data["prepared"]["arguments"]
        assert (arguments["order_id"], arguments["amount"]) == (request["order_id"], request["amount"])
        # Never above the refundable balance: the one the provider had, and the one the order started with.
        assert 1 <= request["amount"] <= request["balance_before"] <= REFUNDABLE[request["order_id"]]
        # Approved after that proposal (and before any other), by another user who holds the role.
        first_call = next(e for e in events if e.trigger == "call" and e.data["intent"]["action_id"] == key)
        approvals = [e for e in events if e.trigger == "approve" and proposal.seq < e.seq < first_call.seq]
        assert len(approvals) == 1, [(e.seq, e.trigger) for e in events]
        approver = approvals[0].actor
        assert approver in APPROVERS and approver not in {started_by, proposal.actor}
        assert not any("prepared" in e.data for e in events if proposal.seq < e.seq < approvals[0].seq)
    # Never twice: money moved at most once per action id and the order's books add up ...
    executions = books.payments.executions()
    assert all(n == 1 for n in executions.values()), executions
    paid: Counter[str] = Counter()
    for refund in books.payments.refunds():
        paid[refund.order_id] += refund.amount
    assert all(paid[o] <= REFUNDABLE[o] for o in paid)
    assert sum(executions.values()) <= sum(1 for e in events if e.trigger == "approve")  # one payment per approval
    # ... and the engine re-sent an action id only after a recorded outcome and a human's retry, or after the
    # provider said it had never seen it.
    calls = [e for e in events if e.trigger == "call"]
    for key in {e.data["intent"]["action_id"] for e in calls}:
        for earlier, later in pairwise(e for e in calls if e.data["intent"]["action_id"] == key):
            between = [e for e in events if earlier.seq < e.seq < later.seq]
            assert any(e.trigger == "retry_refund" for e in between) or any(
                e.trigger == "reconcile" and e.data["reconciled"] == {"outcome": "not_found", "action_id": key}
                for e in between
            )
            seen["resent"] += 1
    for event in events:
        if event.trigger == "succeeded" and event.data.get("reconciled"):
            seen["reconciled"] += 1  # a retry after an unknown outcome asked the provider instead of paying again
    sent = Counter(r["idempotency_key"] for r in requests)
    intents = Counter(e.data["intent"]["action_id"] for e in calls)
    assert all(sent[key] <= intents[key] for key in sent)  # nothing reached the provider without an intent


def test_refund_v1_never_pays_without_another_approver_above_the_balance_or_twice(db_url: str) -> None:
    seen: Counter[str] = Counter()
    with fake_systems(db_url) as books, reference_engine(db_url) as eng:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(starter=st.sampled_from(["ann", "dana"]), story=stories())
        def property_holds(starter: str, story: tuple[str, list[tuple[Any, ...]]]) -> None:
            customer, script = story
            books.reset()
            task_id = eng.start(
                "refund", {"customer_id": customer, "message": "Refund please."}, actor=starter, version=1
            )
            for move in script:
                apply(eng, books, task_id, move, seen)
            check(eng, books, task_id, seen)

        property_holds()
    # A property no example ever put to the test proves nothing: some refunds were paid, some approvals refused.
    # A retry after a failed or lost payment was exercised: re-sent (after a refusal or a not_found) or settled by
    # asking the provider (after an unknown outcome, which is never re-sent blindly).
    assert seen["paid"] >= 1 and seen["resent"] + seen["reconciled"] >= 1, seen
    assert any(k.startswith("refused:approve:APPROVAL_FORBIDDEN") for k in seen), seen
