"""People and database tokens: who may sign in, with which roles, and the access trail of every change.

`People` is the one place that changes them (`railyard users`, `railyard tokens
new --save` and `revoke`, the OpenID Connect sign-in through `sync_external`).
Each change is checked here, then written by the store together with its
access-trail entry, in one transaction: there is no change without its entry.
A write names the revision of the person it was decided on, so two changes made
at once never overwrite each other (the later one is decided again).

Passwords are hashed with Argon2id (`argon2-cffi`); the hash is kept, never the
password, and neither is ever written to the trail, a log line or a listing.
`verify` takes as long for a name nobody has as for a wrong password, and gives
the same answer for both (and for a disabled person), so a login form does not
tell which names exist.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from engine.core.canonical import format_instant, now
from engine.core.errors import Code, RailyardError, Refused
from engine.core.people import (
    MIN_PASSWORD,
    AccessAction,
    AccessChange,
    Person,
    Source,
    StoredToken,
    name_problem,
    role_problem,
    tenant_problem,
)
from engine.runtime.engine import MAX_ACTOR_LENGTH
from engine.store.protocol import BackOffice

log = logging.getLogger("railyard.people")

#: How many times a change is decided again when the person changed under it before giving up.
_TRIES = 5


@dataclass(frozen=True, slots=True)
class Outcome:
    """A person after a change, and the trail entries it wrote (none: there was nothing to change)."""

    person: Person
    changes: tuple[AccessChange, ...]


def _usage(message: str) -> RailyardError:
    return RailyardError(message, code=Code.USAGE_INVALID)


def _check_by(by: str) -> None:
    if not by.strip() or len(by) > MAX_ACTOR_LENGTH or any(ord(c) < 0x20 for c in by):
        raise _usage(f"who makes the change (--by) must be 1 to {MAX_ACTOR_LENGTH} printable characters")


def _roles(roles: Iterable[str]) -> frozenset[str]:
    found = frozenset(roles)
    for role in sorted(found):
        problem = role_problem(role)
        if problem is not None:
            raise _usage(problem)
    return found


def _tenants(tenants: Iterable[str] | None) -> frozenset[str] | None:
    listed = list(tenants) if tenants is not None else None
    problem = tenant_problem(listed)
    if problem is not None:
        raise _usage(problem)
    return frozenset(listed) if listed is not None else None


def _sorted(names: frozenset[str] | None) -> list[str] | None:
    return sorted(names) if names is not None else None


class People:
    """The people and database tokens of a store, and their access trail (see the module's docstring)."""

    def __init__(
        self, store: BackOffice, *, clock: Callable[[], datetime] = now, hasher: PasswordHasher | None = None
    ) -> None:
        self.store = store
        self._clock = clock
        self._hasher = hasher if hasher is not None else PasswordHasher()
        self._dummy: str | None = None

    # -- reads -----------------------------------------------------------------------------------
    def get(self, name: str) -> Person | None:
        return self.store.person(name)

    def require(self, name: str) -> Person:
        found = self.store.person(name)
        if found is None:
            raise Refused(f"no person {name[:200]!r}", code=Code.USER_NOT_FOUND, name=name[:200])
        return found

    def everyone(self) -> list[Person]:
        return self.store.people()

    def trail(
        self, *, subject: str | None = None, after: int | None = None, limit: int | None = None
    ) -> list[AccessChange]:
        return self.store.access_trail(subject=subject, after=after, limit=limit)

    # -- passwords -------------------------------------------------------------------------------
    def hash_password(self, password: str) -> str:
        if len(password) < MIN_PASSWORD:
            raise _usage(f"a password must be at least {MIN_PASSWORD} characters")
        if len(password) > 1000:
            raise _usage("a password must be at most 1000 characters")
        return self._hasher.hash(password)

    def verify(self, name: str, password: str) -> Person | None:
        """The person whose name and password these are, if they may sign in (enabled, with a password); else
        None, after as much work as a wrong password costs, whatever was wrong."""
        person = self.store.person(name) if name_problem(name) is None else None
        stored = person.password_hash if person is not None else None
        try:
            self._hasher.verify(stored or self._dummy_hash(), password)
        except (VerificationError, InvalidHashError):
            return None
        if person is None or stored is None or person.disabled:
            return None
        return person

    def _dummy_hash(self) -> str:
        """A hash no password given is checked against for real: it makes a miss cost what a wrong password does."""
        if self._dummy is None:
            self._dummy = self._hasher.hash("no one's password: " + format_instant(self._clock()))
        return self._dummy

    # -- changes ---------------------------------------------------------------------------------
    def add(
        self,
        name: str,
        roles: Iterable[str] = (),
        tenants: Iterable[str] | None = None,
        *,
        password: str | None = None,
        by: str,
        source: Source = Source.LOCAL,
    ) -> Outcome:
        """A new person. USER_EXISTS if the name is taken: by a person (in any letter case), or by a live
        database token's actor (a token speaks for a machine, a name for one identity)."""
        _check_by(by)
        problem = name_problem(name)
        if problem is not None:
            raise _usage(problem)
        held, within = _roles(roles), _tenants(tenants)
        hashed = self.hash_password(password) if password is not None else None
        folded = name.casefold()
        same = next((p.name for p in self.store.people() if p.name.casefold() == folded), None)
        if same is not None:
            raise Refused(f"a person {same!r} exists already", code=Code.USER_EXISTS, name=same)
        at = self._clock()
        if any(t.live(at) for t in self.store.api_tokens(actor=name)):
            raise Refused(
                f"{name!r} is the actor of a database token: revoke it first, or choose another name",
                code=Code.USER_EXISTS,
                name=name,
            )
        person = Person(name, held, within, hashed, False, source, at, at, 1)
        entry = AccessChange(
            at,
            by,
            AccessAction.PERSON_ADDED,
            name,
            {"roles": sorted(held), "tenants": _sorted(within), "source": str(source), "password": hashed is not None},
        )
        if not self.store.write_person(person, [entry], revision=None):
            raise Refused(f"a person {name!r} exists already", code=Code.USER_EXISTS, name=name)
        log.info("person %s added by %s", name, by)
        return Outcome(person, (entry,))

    def grant(self, name: str, role: str, *, by: str) -> Outcome:
        """Give `name` the role `role` (nothing changes, and nothing is recorded, if they hold it)."""
        (checked,) = _roles([role])

        def edit(person: Person) -> tuple[Person, list[tuple[AccessAction, dict[str, Any]]]]:
            if checked in person.roles:
                return person, []
            return replace(person, roles=person.roles | {checked}), [(AccessAction.ROLE_GRANTED, {"role": checked})]

        return self._change(name, by, edit)

    def revoke(self, name: str, role: str, *, by: str) -> Outcome:
        """Take the role `role` from `name` (nothing changes if they do not hold it)."""

        def edit(person: Person) -> tuple[Person, list[tuple[AccessAction, dict[str, Any]]]]:
            if role not in person.roles:
                return person, []
            return replace(person, roles=person.roles - {role}), [(AccessAction.ROLE_REVOKED, {"role": role})]

        return self._change(name, by, edit)

    def set_tenants(self, name: str, tenants: Iterable[str] | None, *, by: str) -> Outcome:
        """Confine `name` to these tenants (None: to none)."""
        within = _tenants(tenants)

        def edit(person: Person) -> tuple[Person, list[tuple[AccessAction, dict[str, Any]]]]:
            if person.tenants == within:
                return person, []
            details = {"tenants": _sorted(within), "previous": _sorted(person.tenants)}
            return replace(person, tenants=within), [(AccessAction.TENANTS_SET, details)]

        return self._change(name, by, edit)

    def disable(self, name: str, *, by: str) -> Outcome:
        """`name` may no longer sign in, and their sessions stop working on their next request."""
        return self._flag(name, True, by=by)

    def enable(self, name: str, *, by: str) -> Outcome:
        return self._flag(name, False, by=by)

    def _flag(self, name: str, disabled: bool, *, by: str) -> Outcome:
        action = AccessAction.PERSON_DISABLED if disabled else AccessAction.PERSON_ENABLED

        def edit(person: Person) -> tuple[Person, list[tuple[AccessAction, dict[str, Any]]]]:
            if person.disabled == disabled:
                return person, []
            return replace(person, disabled=disabled), [(action, {})]

        return self._change(name, by, edit)

    def set_password(self, name: str, password: str, *, by: str) -> Outcome:
        """Set `name`'s password (the trail records that it changed, never what to). Only for a local person: an
        OpenID Connect person signs in at their provider."""
        hashed = self.hash_password(password)

        def edit(person: Person) -> tuple[Person, list[tuple[AccessAction, dict[str, Any]]]]:
            if person.source is not Source.LOCAL:
                raise _usage(f"{person.name!r} signs in through {person.source}: they have no password here")
            return replace(person, password_hash=hashed), [(AccessAction.PASSWORD_SET, {})]

        return self._change(name, by, edit)

    def sync_external(
        self,
        name: str,
        roles: Iterable[str],
        tenants: Iterable[str] | None,
        *,
        source: Source = Source.OIDC,
        by: str,
    ) -> Outcome:
        """Make the person `name` of `source` exist with exactly `roles` and `tenants` (None: not confined), as an
        external identity provider says at sign-in; each difference is one trail entry by `by` (added, each role
        granted or revoked, the tenants set), and nothing is written when nothing differs.

        The person keeps no password. A person disabled here stays disabled (the provider's word does not enable
        them): the caller checks `outcome.person.disabled` and refuses the sign-in. A person of that name from
        another source (a local one) is never taken over: USER_EXISTS. A name, role or tenant that is not one
        Railyard accepts is USAGE_INVALID (`engine.core.people`)."""
        held, within = _roles(roles), _tenants(tenants)
        for _ in range(_TRIES):
            person = self.store.person(name)
            if person is None:
                try:
                    return self.add(name, held, within, by=by, source=source)
                except Refused as refused:
                    if refused.code is Code.USER_EXISTS and self.store.person(name) is not None:
                        continue  # added at the same moment (another sign-in): decide again on it
                    raise
            if person.source is not source:
                raise Refused(
                    f"a {person.source} person {name!r} exists: a {source} sign-in does not take it over",
                    code=Code.USER_EXISTS,
                    name=name,
                )
            entries: list[tuple[AccessAction, dict[str, Any]]] = []
            entries += [(AccessAction.ROLE_GRANTED, {"role": r}) for r in sorted(held - person.roles)]
            entries += [(AccessAction.ROLE_REVOKED, {"role": r}) for r in sorted(person.roles - held)]
            if person.tenants != within:
                entries.append(
                    (AccessAction.TENANTS_SET, {"tenants": _sorted(within), "previous": _sorted(person.tenants)})
                )
            written = self._write(replace(person, roles=held, tenants=within), person, entries, by)
            if written is not None:
                return written
        raise _moved(name)

    def _change(
        self,
        name: str,
        by: str,
        edit: Callable[[Person], tuple[Person, list[tuple[AccessAction, dict[str, Any]]]]],
    ) -> Outcome:
        """Decide a change on the person as they are now and write it with its trail entries; decided again (a
        few times) if they changed meanwhile."""
        _check_by(by)
        for _ in range(_TRIES):
            person = self.require(name)
            changed, entries = edit(person)
            written = self._write(changed, person, entries, by)
            if written is not None:
                return written
        raise _moved(name)

    def _write(
        self, changed: Person, person: Person, entries: list[tuple[AccessAction, dict[str, Any]]], by: str
    ) -> Outcome | None:
        _check_by(by)
        if not entries:
            return Outcome(person, ())
        at = self._clock()
        new = replace(changed, updated_at=at, revision=person.revision + 1)
        changes = tuple(AccessChange(at, by, action, person.name, details) for action, details in entries)
        if not self.store.write_person(new, changes, revision=person.revision):
            return None
        log.info("person %s: %s by %s", person.name, ", ".join(str(a) for a, _ in entries), by)
        return Outcome(new, changes)

    # -- database tokens -------------------------------------------------------------------------
    def token(self, sha256: str) -> StoredToken | None:
        return self.store.api_token(sha256)

    def tokens(self) -> list[StoredToken]:
        return self.store.api_tokens()

    def live_token(self, sha256: str) -> StoredToken | None:
        """The database token of this hash if it signs in now (not revoked, not expired)."""
        found = self.store.api_token(sha256)
        return found if found is not None and found.live(self._clock()) else None

    def add_token(
        self,
        sha256: str,
        actor: str,
        roles: Iterable[str],
        tenants: Iterable[str] | None,
        expires: datetime | None,
        *,
        by: str,
    ) -> StoredToken:
        """Keep a token's hash with what it may do. One actor holds one set of roles and tenants whichever token
        it uses: refused (USAGE_INVALID) when the actor's live tokens hold others, and (USER_EXISTS) when the
        actor is a person (tokens are for machines; a person signs in)."""
        _check_by(by)
        if not actor.strip() or len(actor) > MAX_ACTOR_LENGTH:
            raise _usage(f"a token's actor must be 1 to {MAX_ACTOR_LENGTH} characters")
        held, within = _roles(roles), _tenants(tenants)
        at = self._clock()
        if self.store.person(actor) is not None:
            raise Refused(
                f"{actor!r} is a person: API tokens in the database are for machines (a person signs in)",
                code=Code.USER_EXISTS,
                name=actor,
            )
        for other in self.store.api_tokens(actor=actor):
            if other.live(at) and (other.roles, other.tenants) != (held, within):
                raise _usage(
                    f"{actor!r} holds a live token with roles {sorted(other.roles)} and tenants "
                    f"{_sorted(other.tenants)}: one actor's tokens hold the same (revoke that one first)"
                )
        token = StoredToken(sha256, actor, held, within, expires, at, by)
        entry = AccessChange(
            at,
            by,
            AccessAction.TOKEN_ADDED,
            sha256,
            {
                "actor": actor,
                "roles": sorted(held),
                "tenants": _sorted(within),
                "expires": format_instant(expires) if expires is not None else None,
            },
        )
        if not self.store.add_api_token(token, entry):
            raise _usage("that token's hash is kept already")
        log.info("token %s… for %s added by %s", sha256[:12], actor, by)
        return token

    def find_token(self, prefix: str) -> StoredToken:
        """The database token whose hash starts with `prefix` (8 hex characters or more)."""
        text = prefix.strip().lower()
        if len(text) < 8 or any(c not in "0123456789abcdef" for c in text):
            raise _usage("give at least the first 8 hex characters of the token's sha256 (`railyard tokens list`)")
        found = [t for t in self.store.api_tokens() if t.sha256.startswith(text)]
        if not found:
            raise Refused(f"no database token's sha256 starts with {text!r}", code=Code.TOKEN_NOT_FOUND)
        if len(found) > 1:
            raise _usage(f"{text!r} starts the sha256 of {len(found)} tokens: give more of it")
        return found[0]

    def revoke_token(self, prefix: str, *, by: str) -> StoredToken:
        """Revoke the database token whose hash starts with `prefix`: it stops working on its next request."""
        _check_by(by)
        token = self.find_token(prefix)
        at = self._clock()
        entry = AccessChange(at, by, AccessAction.TOKEN_REVOKED, token.sha256, {"actor": token.actor})
        if not self.store.revoke_api_token(token.sha256, at, by, entry):
            raise Refused(
                f"the token {token.sha256[:12]}… of {token.actor!r} was revoked already", code=Code.TOKEN_NOT_FOUND
            )
        log.info("token %s… of %s revoked by %s", token.sha256[:12], token.actor, by)
        return replace(token, revoked_at=at, revoked_by=by)

    # -- roles, for the engine ----------------------------------------------------------------
    def token_scope(self, actor: str) -> tuple[frozenset[str], frozenset[str] | None] | None:
        """The roles and tenants of `actor`'s live database tokens (one set: `add_token` keeps an actor's tokens
        alike); None when it has none."""
        at = self._clock()
        live = [t for t in self.store.api_tokens(actor=actor) if t.live(at)]
        return (live[0].roles, live[0].tenants) if live else None


def _moved(name: str) -> RailyardError:
    return RailyardError(
        f"{name!r} was changed by someone else {_TRIES} times while this change was decided: try again",
        code=Code.DATABASE_ERROR,
    )


def sync_external(
    people: People | BackOffice,
    name: str,
    roles: Iterable[str],
    tenants: Iterable[str] | None,
    *,
    source: Source | str = Source.OIDC,
    by: str,
) -> Outcome:
    """`People.sync_external` over `people` (a `People`, or a store to make one of): the person `name` exists, of
    `source`, with exactly `roles` and `tenants` (None: not confined), each change recorded in the access trail
    as made by `by`. Check `outcome.person.disabled` before opening a session."""
    over = people if isinstance(people, People) else People(people)
    return over.sync_external(name, roles, tenants, source=Source(source), by=by)


def person_summary(person: Person) -> Mapping[str, Any]:
    """A person as the CLI and the API show them (never the password's hash)."""
    listed = person.listed()
    for key in ("created_at", "updated_at"):
        value = listed[key]
        listed[key] = format_instant(value) if isinstance(value, datetime) else None
    return listed
