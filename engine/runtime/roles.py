"""Who holds which role. Identity always comes from the trusted caller, never from a payload."""

from __future__ import annotations

import threading
import time
import tomllib
from collections.abc import Callable, Mapping, Set
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from engine.core.errors import Code, RailyardError
from engine.runtime import config

if TYPE_CHECKING:
    from engine.core.people import Person
    from engine.store.protocol import Store


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


class PeopleFirst:
    """The trusted process's `Authoriser` (the CLI's `--as`, a worker, the Python API's default): a person kept in
    the database (`railyard users`) is who the people table says, with none of their roles while disabled, so a
    role revoked or a person disabled holds at the command line as it does on the server; any other actor is the
    fallback's (the roles file). A person is read at most once every `ttl` seconds per process: a worker asks on
    every transition it fires, and its own actors are never people."""

    def __init__(
        self, store: Store, fallback: Authoriser, *, ttl: float = 2.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.fallback = fallback
        self._ttl, self._clock = ttl, clock
        self._seen: dict[str, tuple[float, Person | None]] = {}
        self._lock = threading.Lock()

    def _person(self, actor: str) -> Person | None:
        at = self._clock()
        with self._lock:
            cached = self._seen.get(actor)
        if cached is not None and at - cached[0] < self._ttl:
            return cached[1]
        found = self.store.person(actor)
        with self._lock:
            if len(self._seen) > 10_000:  # many actors (a portal's customers): forget, never grow without bound
                self._seen.clear()
            self._seen[actor] = (at, found)
        return found

    def roles_of(self, actor: str) -> Set[str]:
        person = self._person(actor)
        return person.caller.roles if person is not None else self.fallback.roles_of(actor)

    def tenants_of(self, actor: str) -> frozenset[str] | None:
        person = self._person(actor)
        return person.caller.tenants if person is not None else self.fallback.tenants_of(actor)
