"""Page sessions, failed logins, people, database tokens and the access trail in memory: `MemoryStore`'s part of
`engine.store.protocol.BackOffice` that is not read from the task rows (`engine.store.sql_people` on SQL), kept
the way the database keeps them (times in UTC, the trail's details as the JSON text read back)."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from engine.core.canonical import canonical_json, utc
from engine.core.people import AccessChange, Person, StoredToken
from engine.store.protocol import PageSession, key_refused


class MemoryPeople:
    """The back office's own rows in memory, under the store's one lock."""

    _lock: threading.Lock

    def __init__(self) -> None:
        self._sessions: dict[str, tuple[PageSession, str | None]] = {}  # a session and its pending flash
        self._login_failures: list[tuple[str, datetime]] = []
        self._people: dict[str, Person] = {}
        self._tokens: dict[str, StoredToken] = {}
        self._trail: list[AccessChange] = []

    # -- page sessions --------------------------------------------------
    def open_session(self, session: PageSession) -> None:
        with self._lock:
            for key, (kept, _) in list(self._sessions.items()):
                if kept.expires_at <= session.created_at:
                    del self._sessions[key]
            if session.id_hash in self._sessions:
                raise key_refused("the session exists")
            self._sessions[session.id_hash] = (
                replace(session, created_at=utc(session.created_at), expires_at=utc(session.expires_at), flash=None),
                session.flash,
            )

    def page_session(self, id_hash: str, at: datetime) -> PageSession | None:
        with self._lock:
            kept = self._sessions.get(id_hash)
        return replace(kept[0], flash=kept[1]) if kept is not None and kept[0].expires_at > utc(at) else None

    def end_session(self, id_hash: str) -> None:
        with self._lock:
            self._sessions.pop(id_hash, None)

    def set_flash(self, id_hash: str, message: str) -> None:
        with self._lock:
            kept = self._sessions.get(id_hash)
            if kept is not None:
                self._sessions[id_hash] = (kept[0], message)

    def take_flash(self, id_hash: str) -> str | None:
        with self._lock:
            kept = self._sessions.get(id_hash)
            if kept is None:
                return None
            self._sessions[id_hash] = (kept[0], None)
            return kept[1]

    # -- failed logins --------------------------------------------------
    def note_login_failure(self, keys: Sequence[str], at: datetime, *, forget_before: datetime) -> None:
        with self._lock:
            kept = [(k, t) for k, t in self._login_failures if t >= utc(forget_before)]
            self._login_failures = kept + [(k, utc(at)) for k in keys]

    def login_failures(self, keys: Sequence[str], after: datetime) -> dict[str, list[datetime]]:
        wanted = set(keys)
        found: dict[str, list[datetime]] = {}
        with self._lock:
            for key, at in sorted(self._login_failures, key=lambda f: f[1]):
                if key in wanted and at > utc(after):
                    found.setdefault(key, []).append(at)
        return found

    def clear_login_failures(self, key: str) -> None:
        with self._lock:
            self._login_failures = [(k, t) for k, t in self._login_failures if k != key]

    # -- people, database tokens and the access trail --------------------
    def person(self, name: str) -> Person | None:
        with self._lock:
            return self._people.get(name)

    def people(self) -> list[Person]:
        with self._lock:
            return [self._people[name] for name in sorted(self._people)]

    def write_person(self, person: Person, changes: Sequence[AccessChange], *, revision: int | None) -> bool:
        with self._lock:
            kept = self._people.get(person.name)
            if (kept is None) != (revision is None) or (kept is not None and kept.revision != revision):
                return False
            created = kept.created_at if kept is not None else person.created_at
            self._people[person.name] = replace(
                person,
                created_at=utc(created) if created is not None else None,
                updated_at=utc(person.updated_at) if person.updated_at is not None else None,
            )
            self._append_trail(changes)
        return True

    def api_token(self, sha256: str) -> StoredToken | None:
        with self._lock:
            return self._tokens.get(sha256)

    def api_tokens(self, *, actor: str | None = None) -> list[StoredToken]:
        with self._lock:
            found = [t for t in self._tokens.values() if actor is None or t.actor == actor]
        return sorted(found, key=lambda t: (t.created_at, t.sha256))

    def add_api_token(self, token: StoredToken, change: AccessChange) -> bool:
        with self._lock:
            if token.sha256 in self._tokens:
                return False
            self._tokens[token.sha256] = replace(
                token,
                created_at=utc(token.created_at),
                expires_at=utc(token.expires_at) if token.expires_at is not None else None,
            )
            self._append_trail([change])
        return True

    def revoke_api_token(self, sha256: str, at: datetime, by: str, change: AccessChange) -> bool:
        with self._lock:
            kept = self._tokens.get(sha256)
            if kept is None or kept.revoked_at is not None:
                return False
            self._tokens[sha256] = replace(kept, revoked_at=utc(at), revoked_by=by)
            self._append_trail([change])
        return True

    def access_trail(
        self, *, subject: str | None = None, after: int | None = None, limit: int | None = None
    ) -> list[AccessChange]:
        with self._lock:
            found = [
                c
                for c in self._trail
                if (subject is None or c.subject == subject) and (after is None or (c.id or 0) > after)
            ]
        return found[:limit] if limit is not None else found

    def _append_trail(self, changes: Sequence[AccessChange]) -> None:
        for change in changes:
            # As the database keeps it: the details as JSON text read back, the time in UTC.
            details = json.loads(canonical_json(dict(change.details)))
            self._trail.append(replace(change, at=utc(change.at), details=details, id=len(self._trail) + 1))
