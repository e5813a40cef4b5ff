"""Bearer tokens: who a token speaks for, with which roles, read from a TOML file that holds only hashes.

A leaked tokens file must not let anyone in, so it stores the SHA-256 of each
token, never the token. The same file is the source of roles for approvals
(`TokenTable.roles_of`: it is an `Authoriser`), so what the inbox offers and what the engine
allows cannot disagree. Pure apart from `load_tokens`, which reads the file.

    [[token]]
    actor = "dana"
    roles = ["refund_approver"]
    sha256 = "<64 hex characters>"

`railyard tokens new --actor dana --role refund_approver` makes a random token,
prints it once and prints the entry to paste into the file; `railyard tokens
hash` hashes a token read from stdin (`engine.cli.tokens`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import tomllib
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.access import AUDITOR, Caller
from engine.core.errors import Code, RailyardError
from engine.runtime.engine import MAX_ACTOR_LENGTH

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def hash_token(token: str) -> str:
    """The form a token is stored in: SHA-256 hex of its UTF-8 bytes (tokens are random, so no salt is needed)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """A fresh token with 256 bits of randomness, URL-safe so it fits a header and a form field."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller a valid token (or a session made from one) stands for."""

    actor: str
    roles: frozenset[str]
    token_hash: str

    @property
    def read_only(self) -> bool:
        return AUDITOR in self.roles

    @property
    def caller(self) -> Caller:
        """Who this is to the one authorisation point (`engine.core.access`)."""
        return Caller(self.actor, self.roles)


class TokenTable:
    """Token hashes to principals; an actor's roles are the same whichever of its tokens is used."""

    def __init__(self, principals: Iterable[Principal] = ()) -> None:
        self._by_hash: dict[str, Principal] = {}
        self._roles: dict[str, frozenset[str]] = {}
        problems: list[str] = []
        for p in principals:
            if p.token_hash in self._by_hash:
                problems.append(f"a token hash is listed twice (actor {p.actor!r})")
            if self._roles.setdefault(p.actor, p.roles) != p.roles:
                problems.append(f"actor {p.actor!r} has tokens with different roles")
            self._by_hash[p.token_hash] = p
        if problems:
            raise RailyardError("tokens: " + "; ".join(problems), code=Code.CONFIG_INVALID)

    @classmethod
    def from_tokens(cls, tokens: Mapping[str, tuple[str, Set[str]]]) -> TokenTable:
        """A table from clear tokens (`token -> (actor, roles)`): for tests and tools, never a file format."""
        return cls(Principal(actor, frozenset(roles), hash_token(token)) for token, (actor, roles) in tokens.items())

    def authenticate(self, token: str) -> Principal | None:
        """The principal of a presented token, or None; compared in constant time against each stored hash."""
        presented = hash_token(token)
        found = None
        for stored, principal in self._by_hash.items():
            if hmac.compare_digest(stored, presented):
                found = principal
        return found

    def by_hash(self, token_hash: str) -> Principal | None:
        """The principal a session cookie names (by the hash of the token it was opened with)."""
        return self._by_hash.get(token_hash)

    def roles_of(self, actor: str) -> Set[str]:
        """`Authoriser`: the engine asks this when it checks roles, so approvals follow the tokens file."""
        return self._roles.get(actor, frozenset())

    def __len__(self) -> int:
        return len(self._by_hash)


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
        unknown = sorted(set(entry) - {"actor", "roles", "sha256"})
        if unknown:
            problems.append(f"{where}: unknown keys {unknown} (a clear-text token is never stored; use sha256)")
        actor, roles, digest = entry.get("actor"), entry.get("roles", []), entry.get("sha256")
        if not isinstance(actor, str) or not actor.strip() or len(actor) > MAX_ACTOR_LENGTH:
            problems.append(f"{where}: actor must be 1 to {MAX_ACTOR_LENGTH} characters")
        if not isinstance(roles, list) or not all(isinstance(r, str) and r for r in roles):
            problems.append(f"{where}: roles must be a list of role names")
        if not isinstance(digest, str) or not _HEX64.match(digest):
            problems.append(f"{where}: sha256 must be 64 lowercase hex characters")
        if not problems:
            principals.append(Principal(str(actor), frozenset(roles), str(digest)))
    if problems:
        raise RailyardError(f"{source}: " + "; ".join(problems), code=Code.CONFIG_INVALID)
    return TokenTable(principals)


def load_tokens(path: str | Path) -> TokenTable:
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RailyardError(f"cannot read tokens file {path}: {exc}", code=Code.CONFIG_INVALID) from None
    return parse_tokens(doc, f"tokens file {path}")


def toml_entry(actor: str, roles: Iterable[str], token_hash: str) -> str:
    """The `[[token]]` entry for a tokens file (TOML basic strings, escaped through JSON's rules)."""
    import json

    role_list = ", ".join(json.dumps(r) for r in roles)
    return f'[[token]]\nactor = {json.dumps(actor)}\nroles = [{role_list}]\nsha256 = "{token_hash}"\n'
