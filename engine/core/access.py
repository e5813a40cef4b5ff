"""Who may act and who may read: the one authorisation point, a pure function of the definition and the caller.

Deny by default. Every trigger a person fires names the role that may fire it
(`Action.role`, an approval state's `role`, the workflow's `operator_role` and
its narrower `cancel_role`, `settle_role`, `redrive_role`), or says explicitly
that any signed-in person may (`ANYONE`); a definition that leaves one unset does
not validate (`engine.core.definition`). An agent state's actions are the
model's: a person fires one only while holding the role the workflow declares
for standing in (`Agent.override_role`, else `Workflow.model_override_role`),
and the event records that they did. The `auditor` role reads everything and
fires nothing.

A person reads the tasks of the workflows that name a role they hold (or that
let anyone act); what they may not read is absent, never an error that says
it exists. `decide`, the approval checks, the read side and the pages all ask
here; nothing above re-derives a role.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Set
from dataclasses import dataclass

from engine.core.definition import ANYONE, CANCEL, Agent, Workflow
from engine.core.errors import Code, Refused

#: A role that may read everything and write nothing, whatever other roles the caller holds.
AUDITOR = "auditor"

#: A role that looks after the install's webhooks in the back office: sees the subscriptions and deliveries, and
#: sends deliveries again. Subscriptions are the whole install's, so it is honoured only for a caller confined to no
#: tenant (a delivery names any tenant's task).
WEBHOOK_ADMIN = "webhook_admin"


def may_see_webhooks(caller: Caller) -> bool:
    """Whether the webhooks page is this caller's: a webhook admin, or an auditor (who reads, never replays), of
    no tenant."""
    return caller.tenants is None and bool({WEBHOOK_ADMIN, AUDITOR} & caller.roles)


def may_replay_webhooks(caller: Caller) -> bool:
    """Whether this caller may send deliveries again: a webhook admin of no tenant, not an auditor."""
    return caller.tenants is None and WEBHOOK_ADMIN in caller.roles and not caller.read_only


#: What a tenant's name may be: it is stored on the task (64 characters at most) and typed in tokens and options.
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking, as the trusted caller says (a token, a session, the authoriser): never a request's field."""

    actor: str
    roles: frozenset[str] = frozenset()
    #: The tenants whose tasks the caller may start, read and act on; None: not confined to any (a single-tenant
    #: install, the trusted process). A confined caller never sees a task of no tenant.
    tenants: frozenset[str] | None = None

    @property
    def read_only(self) -> bool:
        return AUDITOR in self.roles


def in_tenants(tenant: str | None, caller: Caller | None) -> bool:
    """Whether a task of `tenant` (None: of none) is within `caller`'s tenants: every task for a caller confined
    to none (and for the trusted process, None); for a confined caller only its own tenants' tasks."""
    return caller is None or _of_tenants(tenant, caller.tenants)


def _of_tenants(tenant: str | None, tenants: frozenset[str] | None) -> bool:
    """The tenant rule itself: no bound (None) admits every task; a bound admits only its tenants' tasks."""
    return tenants is None or (tenant is not None and tenant in tenants)


def start_tenant(caller: Caller, asked: str | None) -> str | None:
    """The tenant a task `caller` starts belongs to: the caller's, never the input's. `asked` only chooses among
    the caller's own tenants (and is required when it has several); a caller confined to none may name any, or
    none for a task of no tenant."""
    if asked is not None and not TENANT_NAME.match(asked):
        raise Refused(f"{asked!r} is not a tenant name", code=Code.PAYLOAD_INVALID, tenant=asked[:80])
    if caller.tenants is None:
        return asked
    if asked is None:
        if len(caller.tenants) == 1:
            return next(iter(caller.tenants))
        raise Refused(
            f"{caller.actor!r} belongs to {len(caller.tenants)} tenants: say which one the task is for (tenant)",
            code=Code.TENANT_REQUIRED,
            actor=caller.actor,
            tenants=sorted(caller.tenants),
        )
    if asked not in caller.tenants:
        raise Refused(
            f"{caller.actor!r} may not start tasks for tenant {asked!r}",
            code=Code.FORBIDDEN,
            actor=caller.actor,
            tenant=asked,
        )
    return asked


def holds(roles: Set[str], role: str | None) -> bool:
    """Whether `roles` satisfy a declared `role`: `ANYONE` is every signed-in person, None nobody (deny by default)."""
    return role is not None and (role == ANYONE or role in roles)


def is_models(definition: Workflow, state: str, trigger: str) -> bool:
    """Whether `trigger` in `state` is one of the model's actions: a declared action of an agent state."""
    found = definition.state(state)
    return isinstance(found, Agent) and trigger != CANCEL and any(a.name == trigger for a in found.actions)


def override_role(definition: Workflow, state: str, trigger: str) -> str | None:
    """The role a person needs to fire the model's `trigger` in agent state `state` in its place: the action's own
    role, else the state's `override_role`, else the workflow's `model_override_role` (None: nobody may)."""
    found = definition.state(state)
    assert isinstance(found, Agent)
    own = next((a.role for a in found.actions if a.name == trigger and a.role), None)
    return own or found.override_role or definition.model_override_role


def role_needed(definition: Workflow, state: str, trigger: str) -> str | None:
    """The role a person needs to fire `trigger` in `state` (None: no person may). The first candidate's role
    stands for all: a definition gives every candidate of one trigger the same role."""
    if is_models(definition, state, trigger):
        return override_role(definition, state, trigger)
    found = definition.candidates(state, trigger)
    return found[0].role if found else None


def fire_refusal(
    definition: Workflow,
    state: str,
    trigger: str,
    role: str | None,
    caller: Caller,
    *,
    task_id: str,
    system: bool = False,
    by_model: bool = False,
) -> Refused | None:
    """Why `caller` may not fire `trigger` (an action whose role is `role`) in `state`, or None.

    `by_model`: the agent runner fires the model's accepted proposal; the model's own actions need no role.
    `system`: the engine fires one of its own triggers; those that record a person's command (a settlement, a
    cancel waiting on a write) still check that person's role.
    """
    models = is_models(definition, state, trigger)
    if models and by_model:
        return None
    if models:
        needed = override_role(definition, state, trigger)
        if needed is None:
            return Refused(
                f"{trigger!r} in {state!r} is the model's to propose, and {definition.ref} lets no role stand in "
                "for it (model_override_role)",
                code=Code.FORBIDDEN,
                task_id=task_id,
                trigger=trigger,
                actor=caller.actor,
                stand_in=True,
            )
        role = needed
    elif system and role is None:
        return None
    if caller.read_only:
        return Refused(
            f"{caller.actor!r} holds the {AUDITOR!r} role, which reads and never acts",
            code=Code.FORBIDDEN,
            task_id=task_id,
            trigger=trigger,
            actor=caller.actor,
        )
    if not holds(caller.roles, role):
        return Refused(
            f"{caller.actor!r} may not fire {trigger!r}: "
            + (f"role {role!r} required" if role is not None else "no role may (the definition names none)"),
            code=Code.FORBIDDEN,
            task_id=task_id,
            trigger=trigger,
            role=role,
            actor=caller.actor,
        )
    return None


def operator_refusal(definition: Workflow, state: str, trigger: str, caller: Caller, task_id: str) -> Refused | None:
    """Why `caller` may not fire an operator's command that is no action of a state (`redrive`, `fork`): the
    workflow's role for it (`Workflow.operator_of`)."""
    return fire_refusal(definition, state, trigger, definition.operator_of(trigger), caller, task_id=task_id)


def may_fire(definition: Workflow, state: str, trigger: str, caller: Caller) -> bool:
    """Whether `caller` may fire `trigger` in `state` as a person (the engine checks again when it is fired)."""
    role = role_needed(definition, state, trigger)
    return fire_refusal(definition, state, trigger, role, caller, task_id="") is None


def may_read(versions: Iterable[Workflow], caller: Caller | None) -> bool:
    """Whether `caller` may read tasks of a workflow (all its `versions` together: roles carry across versions).

    None is the trusted process itself (the Python API, the CLI without `--as`): it reads everything."""
    if caller is None or caller.read_only:
        return True
    for definition in versions:
        named = definition.roles()
        if ANYONE in named or named & caller.roles:
            return True
    return False


def readable_workflows(definitions: Iterable[Workflow], caller: Caller | None) -> frozenset[str] | None:
    """The names of the workflows whose tasks `caller` may read, of those `definitions` hold (None: every one)."""
    if caller is None or caller.read_only:
        return None
    by_name: dict[str, list[Workflow]] = {}
    for definition in definitions:
        by_name.setdefault(definition.name, []).append(definition)
    return frozenset(name for name, versions in by_name.items() if may_read(versions, caller))


def sees_restricted(definition: Workflow, caller: Caller | None) -> bool:
    """Whether `caller` is shown the fields `definition` restricts (`Workflow.restricted`): the trusted process
    (None), the auditor (who must be able to prove the history), and whoever holds one of the roles it names.
    Everyone else who may read the task is shown `engine.core.visibility.RESTRICTED` in their place."""
    restricted = definition.restricted
    if restricted is None or caller is None or caller.read_only:
        return True
    return bool(set(restricted.roles) & caller.roles)


@dataclass(frozen=True, slots=True)
class Scope:
    """What a caller may read: the tasks of these workflows and of these tenants (None: no bound on either)."""

    workflows: frozenset[str] | None = None
    tenants: frozenset[str] | None = None

    def sees(self, workflow: str, tenant: str | None) -> bool:
        """Whether a task of `workflow` and `tenant` is within the scope."""
        if self.workflows is not None and workflow not in self.workflows:
            return False
        return _of_tenants(tenant, self.tenants)


def read_scope(definitions: Iterable[Workflow], caller: Caller | None) -> Scope:
    """The tasks `caller` may read, of those `definitions` define: by workflow (the roles it holds, or the auditor
    role) and by tenant (its tenants, whatever its roles: an auditor confined to a tenant reads only that one)."""
    if caller is None:
        return Scope()
    return Scope(readable_workflows(definitions, caller), caller.tenants)
