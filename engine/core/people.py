"""People, database tokens and the access trail, as records: pure, no database and no hashing here.

A person is someone who signs in to the pages: a name (the actor the log
records for what they do), roles, the tenants they are confined to (None: not
confined, as `engine.core.access.Caller.tenants`), whether they are disabled,
and where they come from (`local`: managed with `railyard users`, with a
password; `oidc`: made and kept in step by the OpenID Connect sign-in). A
database token is an API token kept as its SHA-256 with the roles, tenants and
expiry it carries. Every change of either is an `AccessChange`, appended to the
access trail in the same transaction as the change itself (`engine.runtime.people`
makes them, the store keeps them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from engine.core.access import TENANT_NAME, Caller
from engine.core.canonical import format_instant
from engine.core.definition import ANYONE

#: What a person's name may be: it is the actor of the events they make (200 characters at most), typed on the
#: command line and in the login form. Letters, digits and `_ . @ + -` (an e-mail address fits), no spaces.
PERSON_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,199}$")
#: What a role's name may be when it is granted (a definition names roles the same way).
ROLE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")
#: The shortest password `railyard users` accepts.
MIN_PASSWORD = 12


class Source(StrEnum):
    """Where a person comes from."""

    LOCAL = "local"  # `railyard users add`: a password in the database
    OIDC = "oidc"  # the OpenID Connect sign-in made them, and keeps their roles in step with the provider's


class AccessAction(StrEnum):
    """What an access-trail entry records. Its `details` never hold a password or a password's hash."""

    PERSON_ADDED = "person.added"  # details: roles, tenants, source, password (whether one was set)
    ROLE_GRANTED = "role.granted"  # details: role
    ROLE_REVOKED = "role.revoked"  # details: role
    TENANTS_SET = "tenants.set"  # details: tenants (None: not confined), previous
    PERSON_DISABLED = "person.disabled"
    PERSON_ENABLED = "person.enabled"
    PASSWORD_SET = "password.set"  # details: {} (that it changed, never what to)
    TOKEN_ADDED = "token.added"  # subject: the token's sha256; details: actor, roles, tenants, expires
    TOKEN_REVOKED = "token.revoked"  # subject: the token's sha256; details: actor


@dataclass(frozen=True, slots=True)
class Person:
    """A person as the people table keeps them. `revision` counts their changes: a write names the revision it
    read, so two changes made at once cannot overwrite each other."""

    name: str
    roles: frozenset[str] = frozenset()
    #: The tenants whose tasks they may read and act on (None: not confined to any).
    tenants: frozenset[str] | None = None
    #: The Argon2 hash of their password (None: they have none, and sign in some other way or not at all).
    password_hash: str | None = field(default=None, repr=False)
    disabled: bool = False
    source: Source = Source.LOCAL
    created_at: datetime | None = None
    updated_at: datetime | None = None
    revision: int = 1

    @property
    def caller(self) -> Caller:
        """Who they are to the one authorisation point; a disabled person holds no role and reads nothing."""
        if self.disabled:
            return Caller(self.name, frozenset(), frozenset())
        return Caller(self.name, self.roles, self.tenants)

    def listed(self) -> dict[str, Any]:
        """What `railyard users list` shows: never the password's hash, only whether there is one."""
        return {
            "name": self.name,
            "roles": sorted(self.roles),
            "tenants": sorted(self.tenants) if self.tenants is not None else None,
            "disabled": self.disabled,
            "source": str(self.source),
            "password": self.password_hash is not None,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True, slots=True)
class StoredToken:
    """An API token kept in the database: its SHA-256 (never the token), whom it speaks for and what it may do."""

    sha256: str
    actor: str
    roles: frozenset[str]
    tenants: frozenset[str] | None
    expires_at: datetime | None
    created_at: datetime
    created_by: str
    revoked_at: datetime | None = None
    revoked_by: str | None = None

    def live(self, at: datetime) -> bool:
        """Whether it signs in at `at`: not revoked, not expired."""
        return self.revoked_at is None and (self.expires_at is None or at < self.expires_at)


@dataclass(frozen=True, slots=True)
class AccessChange:
    """One entry of the access trail: who (`by`) changed what (`action` on `subject`: a person's name, or a
    token's sha256), when, with the details an auditor needs. `id` is its place in the trail (None until kept)."""

    at: datetime
    by: str
    action: AccessAction
    subject: str
    details: Mapping[str, Any] = field(default_factory=dict)
    id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": format_instant(self.at),
            "by": self.by,
            "action": str(self.action),
            "subject": self.subject,
            "details": dict(self.details),
        }


# -- checks ------------------------------------------------------------------------------------------
def name_problem(name: str) -> str | None:
    """Why `name` cannot be a person's name, or None."""
    if not PERSON_NAME.match(name):
        return f"{name[:60]!r} is not a person's name (letters, digits and _ . @ + -, at most 200, no spaces)"
    return None


def role_problem(role: str) -> str | None:
    """Why `role` cannot be granted, or None. `anyone` is every signed-in person: it is never granted."""
    if role == ANYONE:
        return f"{ANYONE!r} is every signed-in person: it is not a role anyone is granted"
    if not ROLE_NAME.match(role):
        return f"{role[:60]!r} is not a role name (letters, digits and _ . : -, at most 100)"
    return None


def tenant_problem(tenants: Iterable[str] | None) -> str | None:
    """Why `tenants` cannot confine someone, or None. An empty set would confine them to nothing: not allowed."""
    if tenants is None:
        return None
    listed = list(tenants)
    if not listed:
        return "an empty list of tenants would confine them to nothing (give none for not confined)"
    for tenant in listed:
        if not TENANT_NAME.match(tenant):
            return f"{tenant[:60]!r} is not a tenant name ({TENANT_NAME.pattern})"
    return None
