"""Who a credential is, asked again on every request: the tokens file, the database's tokens, and its people.

`Directory` answers three questions from those three sources:

- `authenticate(token)`: a bearer token is a principal if the tokens file holds
  its hash (unexpired), else if the database does (unexpired, not revoked);
- `by_credential(credential)`: what a page session names, `token:<sha256>` or
  `user:<name>`, read again on every page request, so that a role granted or
  revoked, a person disabled or a token revoked takes effect on the next request
  of every server process, sessions already open included;
- `roles_of(actor)`: the engine's `Authoriser`, so the roles it checks when a
  command is fired are the ones the request's principal was given.

One name is one identity. A person's roles and tenants are the people table's:
a token whose actor names a person (a tokens-file entry made before the person
was added) speaks for that person, with the person's roles and tenants, and
stops working while the person is disabled. `railyard tokens new --save`
refuses to make a database token for a person.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import replace

from engine.api.tokens import Principal, TokenTable, hash_token
from engine.core.people import Person, StoredToken
from engine.runtime.people import People
from engine.runtime.roles import Authoriser

USER_PREFIX = "user:"
TOKEN_PREFIX = "token:"


def person_principal(person: Person) -> Principal:
    """A person signed in to the pages, as the routes see every caller."""
    caller = person.caller
    return Principal(caller.actor, caller.roles, "", None, caller.tenants, kind="person")


def _token_principal(token: StoredToken) -> Principal:
    return Principal(token.actor, token.roles, token.sha256, token.expires_at, token.tenants)


class Directory:
    """The tokens file (`tokens`), the database's tokens and people (`people`); `fallback` answers `roles_of` for
    the actors neither a person nor a tokens-file token (the engine's authoriser before this one was put over it)."""

    def __init__(self, tokens: TokenTable, people: People, fallback: Authoriser | None = None) -> None:
        self.tokens = tokens
        self.people = people
        self.fallback = fallback

    def authenticate(self, token: str) -> Principal | None:
        """The principal of a presented bearer token, or None (unknown, expired, revoked, or a disabled person's)."""
        found = self.tokens.authenticate(token)
        if found is None:
            stored = self.people.live_token(hash_token(token))
            found = _token_principal(stored) if stored is not None else None
        return self._as_person(found)

    def by_credential(self, credential: str) -> Principal | None:
        """The principal a page session's credential names now (None: it signs in no more)."""
        if credential.startswith(USER_PREFIX):
            person = self.people.get(credential[len(USER_PREFIX) :])
            return person_principal(person) if person is not None and not person.disabled else None
        if credential.startswith(TOKEN_PREFIX):
            digest = credential[len(TOKEN_PREFIX) :]
            found = self.tokens.by_hash(digest)
            if found is None:
                stored = self.people.live_token(digest)
                found = _token_principal(stored) if stored is not None else None
            return self._as_person(found)
        return None

    def verify(self, name: str, password: str) -> Principal | None:
        """The person of this name and password, if they may sign in; None for every reason they may not."""
        person = self.people.verify(name, password)
        return person_principal(person) if person is not None else None

    def _as_person(self, principal: Principal | None) -> Principal | None:
        """A token whose actor is a person speaks for that person: the person's roles and tenants, and nothing
        while they are disabled."""
        if principal is None:
            return None
        person = self.people.get(principal.actor)
        if person is None:
            return principal
        if person.disabled:
            return None
        return replace(principal, roles=person.roles, tenants=person.tenants)

    def roles_of(self, actor: str) -> Set[str]:
        """`Authoriser`: a person's roles (none while disabled), else the tokens file's for the actor, else those of
        its live database tokens, else the fallback's."""
        return self._scope(actor)[0]

    def tenants_of(self, actor: str) -> frozenset[str] | None:
        """`Authoriser`: the tenants the actor is confined to, from the same source as its roles (a disabled person
        is confined to none at all: they act on nothing)."""
        return self._scope(actor)[1]

    def _scope(self, actor: str) -> tuple[Set[str], frozenset[str] | None]:
        person = self.people.get(actor)
        if person is not None:
            caller = person.caller
            return caller.roles, caller.tenants
        if self.tokens.knows(actor):
            return self.tokens.roles_of(actor), self.tokens.tenants_of(actor)
        stored = self.people.token_scope(actor)
        if stored is not None:
            return stored
        if self.fallback is not None:
            return self.fallback.roles_of(actor), self.fallback.tenants_of(actor)
        return frozenset(), None
