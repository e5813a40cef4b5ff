"""Who holds which role. Identity always comes from the trusted caller, never from a payload."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Set
from pathlib import Path
from typing import Protocol

from engine.core.errors import Code, RailyardError
from engine.runtime import config


class Authoriser(Protocol):
    """Who an actor is to the engine: the roles it holds and the tenants it is confined to."""

    def roles_of(self, actor: str) -> Set[str]: ...

    def tenants_of(self, actor: str) -> frozenset[str] | None:
        """The tenants `actor` is confined to (None: none, it acts on every tenant's tasks)."""
        ...


class StaticRoles:
    """Roles (and tenants) from mappings `actor -> roles`; an unknown actor holds none and is confined to none."""

    def __init__(
        self,
        roles: Mapping[str, Set[str] | list[str]] | None = None,
        tenants: Mapping[str, Set[str] | list[str]] | None = None,
    ) -> None:
        self._roles = {actor: frozenset(r) for actor, r in (roles or {}).items()}
        self._tenants = {actor: frozenset(t) for actor, t in (tenants or {}).items()}

    def roles_of(self, actor: str) -> Set[str]:
        return self._roles.get(actor, frozenset())

    def tenants_of(self, actor: str) -> frozenset[str] | None:
        return self._tenants.get(actor)


def roles_from_file(path: str | Path) -> StaticRoles:
    """Read a TOML roles file: `[users]` then `bob = ["refund_approver"]`."""
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RailyardError(f"cannot read roles file {path}: {exc}", code=Code.CONFIG_INVALID) from None
    users = doc.get("users", {})
    if not isinstance(users, dict) or not all(
        isinstance(v, list) and all(isinstance(r, str) for r in v) for v in users.values()
    ):
        raise RailyardError(
            f"roles file {path}: [users] must map names to lists of role names", code=Code.CONFIG_INVALID
        )
    return StaticRoles(users)


def default_authoriser() -> Authoriser:
    """RAILYARD_ROLES_FILE if set; otherwise nobody holds any role."""
    path = config.roles_file()
    return roles_from_file(path) if path else StaticRoles()
