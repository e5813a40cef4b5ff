"""Bearer tokens: who a token speaks for, with which roles, read from a TOML file that holds only hashes.

A leaked tokens file must not let anyone in, so it stores the SHA-256 of each
token, never the token. The same file is the source of roles for approvals
(`TokenTable.roles_of`: it is an `Authoriser`), so what the inbox offers and what the engine
allows cannot disagree. Pure apart from `load_tokens`, which reads the file.

    [[token]]
    actor = "dana"
    roles = ["refund_approver"]
    sha256 = "<64 hex characters>"
    expires = 2027-06-30T00:00:00Z   # optional: refused from then on

`railyard tokens new --actor dana --role refund_approver [--expires 90d]` makes
a random token, prints it once and prints the entry to paste into the file;
`railyard tokens hash` hashes a token read from stdin; `railyard tokens list`
shows a file's entries, expired ones marked (`engine.cli.tokens`).

The server reads the file again when it changes (`TokensFile`): a token added,
a role granted, or an entry deleted (revoked) takes effect on the next request,
without a restart, page sessions opened with a revoked or expired token
included. An edit that does not parse leaves the last good table in force
and is logged.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from engine.core.access import AUDITOR, TENANT_NAME, Caller
from engine.core.canonical import format_instant, now, parse_instant
from engine.core.errors import Code, RailyardError
from engine.runtime.engine import MAX_ACTOR_LENGTH

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
log = logging.getLogger("railyard.api")


def hash_token(token: str) -> str:
    """The form a token is stored in: SHA-256 hex of its UTF-8 bytes (tokens are random, so no salt is needed)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """A fresh token with 256 bits of randomness, URL-safe so it fits a header and a form field."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller a valid token, or a person signed in to the pages, stands for."""

    actor: str
    roles: frozenset[str]
    #: The SHA-256 of the token ("" for a person who signed in with a password or through their provider).
    token_hash: str
    #: From this instant on the token is refused (None: it does not expire).
    expires: datetime | None = None
    #: The tenants the token is confined to (None: not confined; `engine.core.access.Caller.tenants`).
    tenants: frozenset[str] | None = None
    #: Who this is: "token" (a token of the file or the database) or "person" (a person of the people table).
    kind: str = "token"

    @property
    def credential(self) -> str:
        """What a page session opened for this principal names, to find it again on every request
        (`engine.api.identity.Directory.by_credential`): `token:<sha256>` or `user:<name>`."""
        return f"user:{self.actor}" if self.kind == "person" else f"token:{self.token_hash}"

    def expired(self, at: datetime) -> bool:
        return self.expires is not None and at >= self.expires

    @property
    def read_only(self) -> bool:
        return AUDITOR in self.roles

    @property
    def caller(self) -> Caller:
        """Who this is to the one authorisation point (`engine.core.access`)."""
        return Caller(self.actor, self.roles, self.tenants)


#: A table's two indexes: principals by token hash, and one principal per actor (its roles and tenants).
_Table = tuple[dict[str, Principal], dict[str, Principal]]


class TokenTable:
    """Token hashes to principals; an actor's roles are the same whichever of its tokens is used. An expired token
    is no token: `authenticate` and `by_hash` answer None for it (`clock` says when now is)."""

    def __init__(self, principals: Iterable[Principal] = (), *, clock: Callable[[], datetime] = now) -> None:
        self._clock = clock
        self._state = self._build(principals)

    @staticmethod
    def _build(principals: Iterable[Principal]) -> _Table:
        by_hash: dict[str, Principal] = {}
        by_actor: dict[str, Principal] = {}
        problems: list[str] = []
        for p in principals:
            if p.token_hash in by_hash:
                problems.append(f"a token hash is listed twice (actor {p.actor!r})")
            first = by_actor.setdefault(p.actor, p)
            if first.roles != p.roles:
                problems.append(f"actor {p.actor!r} has tokens with different roles")
            if first.tenants != p.tenants:
                problems.append(f"actor {p.actor!r} has tokens with different tenants")
            by_hash[p.token_hash] = p
        if problems:
            raise RailyardError("tokens: " + "; ".join(problems), code=Code.CONFIG_INVALID)
        return by_hash, by_actor

    @classmethod
    def from_tokens(cls, tokens: Mapping[str, tuple[str, Set[str]]]) -> TokenTable:
        """A table from clear tokens (`token -> (actor, roles)`): for tests and tools, never a file format."""
        return cls(Principal(actor, frozenset(roles), hash_token(token)) for token, (actor, roles) in tokens.items())

    def _current(self) -> _Table:
        """The table in force (`TokensFile` reads its file again first when it changed)."""
        return self._state

    def authenticate(self, token: str) -> Principal | None:
        """The principal of a presented token, or None; compared in constant time against each stored hash."""
        presented = hash_token(token)
        found = None
        for stored, principal in self._current()[0].items():
            if hmac.compare_digest(stored, presented):
                found = principal
        return found if found is not None and not found.expired(self._clock()) else None

    def by_hash(self, token_hash: str) -> Principal | None:
        """The principal a session cookie names (by the hash of the token it was opened with): None once that token
        is gone from the table or expired, which ends the session."""
        found = self._current()[0].get(token_hash)
        return found if found is not None and not found.expired(self._clock()) else None

    def roles_of(self, actor: str) -> Set[str]:
        """`Authoriser`: the engine asks this when it checks roles, so approvals follow the tokens file."""
        found = self._current()[1].get(actor)
        return found.roles if found is not None else frozenset()

    def tenants_of(self, actor: str) -> frozenset[str] | None:
        """`Authoriser`: the tenants the actor's tokens are confined to (one actor's tokens all say the same)."""
        found = self._current()[1].get(actor)
        return found.tenants if found is not None else None

    def knows(self, actor: str) -> bool:
        """Whether the table holds a token of `actor` (expired ones too: its roles are still the file's to say)."""
        return actor in self._current()[1]

    def principals(self) -> list[Principal]:
        """Every entry, expired ones included (`railyard tokens list`)."""
        return list(self._current()[0].values())

    def __len__(self) -> int:
        return len(self._current()[0])


class TokensFile(TokenTable):
    """A tokens file, read again when it changes (its size or modification time), looked at no more often than
    `every_seconds`: people and their roles change without a restart. An edit that does not parse keeps the last
    good table."""

    def __init__(self, path: str | Path, *, clock: Callable[[], datetime] = now, every_seconds: float = 1.0) -> None:
        self.path = Path(path)
        self._seen = self._stamp()
        super().__init__(read_tokens(self.path).principals(), clock=clock)
        self._lock = threading.Lock()
        self._every = every_seconds
        self._checked = float("-inf")

    def _stamp(self) -> tuple[int, int] | None:
        try:
            found = os.stat(self.path)
        except OSError:
            return None
        return found.st_mtime_ns, found.st_size

    def _current(self) -> _Table:
        moment = time.monotonic()
        if moment - self._checked >= self._every and self._lock.acquire(blocking=False):
            try:
                self._checked = moment
                stamp = self._stamp()
                if stamp != self._seen:
                    self._seen = stamp
                    try:
                        self._state = self._build(read_tokens(self.path).principals())
                        log.info("tokens file %s read again: %d tokens", self.path, len(self._state[0]))
                    except RailyardError as error:
                        log.warning(
                            "tokens file %s changed but is not usable (%s): the last good one stays",
                            self.path,
                            error.message[:200],
                        )
            finally:
                self._lock.release()
        return self._state


def parse_tokens(doc: Mapping[str, Any], source: str = "tokens file") -> TokenTable:
    """Check a parsed tokens file and build its table; every problem is reported at once."""
    entries = doc.get("token", [])
    problems: list[str] = []
    if not isinstance(entries, list):
        raise RailyardError(f"{source}: expected [[token]] entries", code=Code.CONFIG_INVALID)
    principals: list[Principal] = []
    for i, entry in enumerate(entries, start=1):
        where = f"token #{i}"
        if not isinstance(entry, dict):
            problems.append(f"{where} is not a table")
            continue
        unknown = sorted(set(entry) - {"actor", "roles", "sha256", "expires", "tenants"})
        if unknown:
            problems.append(f"{where}: unknown keys {unknown} (a clear-text token is never stored; use sha256)")
        actor, roles, digest = entry.get("actor"), entry.get("roles", []), entry.get("sha256")
        if not isinstance(actor, str) or not actor.strip() or len(actor) > MAX_ACTOR_LENGTH:
            problems.append(f"{where}: actor must be 1 to {MAX_ACTOR_LENGTH} characters")
        if not isinstance(roles, list) or not all(isinstance(r, str) and r for r in roles):
            problems.append(f"{where}: roles must be a list of role names")
        if not isinstance(digest, str) or not _HEX64.match(digest):
            problems.append(f"{where}: sha256 must be 64 lowercase hex characters")
        tenants = entry.get("tenants")
        if tenants is not None and (
            not isinstance(tenants, list)
            or not tenants
            or not all(isinstance(t, str) and TENANT_NAME.match(t) for t in tenants)
        ):
            problems.append(f"{where}: tenants must be a non-empty list of tenant names ({TENANT_NAME.pattern})")
        expires = _expiry(entry.get("expires"))
        if "expires" in entry and expires is None:
            problems.append(f"{where}: expires must be a date-time with its offset (2027-06-30T00:00:00Z)")
        if not problems:
            confined = frozenset(tenants) if tenants is not None else None
            principals.append(Principal(str(actor), frozenset(roles), str(digest), expires, confined))
    if problems:
        raise RailyardError(f"{source}: " + "; ".join(problems), code=Code.CONFIG_INVALID)
    return TokenTable(principals)


def _expiry(value: Any) -> datetime | None:
    """An entry's `expires`: a TOML offset date-time, or the same written as a string; None if it is neither."""
    if isinstance(value, str):
        try:
            value = parse_instant(value)
        except (TypeError, ValueError):
            return None
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value
    return None


def load_tokens(path: str | Path) -> TokensFile:
    """The server's tokens: the file, read again whenever it changes."""
    return TokensFile(path)


def read_tokens(path: str | Path) -> TokenTable:
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RailyardError(f"cannot read tokens file {path}: {exc}", code=Code.CONFIG_INVALID) from None
    return parse_tokens(doc, f"tokens file {path}")


def toml_entry(
    actor: str,
    roles: Iterable[str],
    token_hash: str,
    expires: datetime | None = None,
    tenants: Iterable[str] | None = None,
) -> str:
    """The `[[token]]` entry for a tokens file (TOML basic strings, escaped through JSON's rules)."""
    import json

    role_list = ", ".join(json.dumps(r) for r in roles)
    until = f"expires = {format_instant(expires)}\n" if expires is not None else ""
    within = f"tenants = [{', '.join(json.dumps(t) for t in tenants)}]\n" if tenants is not None else ""
    return f'[[token]]\nactor = {json.dumps(actor)}\nroles = [{role_list}]\nsha256 = "{token_hash}"\n{until}{within}'
