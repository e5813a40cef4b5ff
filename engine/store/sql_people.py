"""The back office's own rows on the SQL store: page sessions, failed logins, and people with their database
tokens and access trail (`engine.store.protocol.BackOffice`, beside the task lists and the work queue, which read
the task rows and stay with `engine.store.sql.SqlStore`). A mixin of `SqlStore`, as `SqlFlow` and `SqlWebhooks`
are: it runs on the store's connections and turns errors into its codes the same way."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, delete, insert, select, update

from engine.core.canonical import canonical_json, utc
from engine.core.errors import StoreError
from engine.core.people import AccessAction, AccessChange, Person, Source, StoredToken
from engine.store.protocol import PageSession
from engine.store.schema import access_trail, api_tokens, login_failures, page_sessions, people


class SqlPeople:
    """Page sessions, failed logins, people, database tokens and the access trail over the SQL store's engine."""

    _writer: Callable[[], AbstractContextManager[Connection]]
    _reader: Callable[[], AbstractContextManager[Connection]]
    _errors: Callable[[], AbstractContextManager[None]]

    # -- page sessions --------------------------------------------------
    def open_session(self, session: PageSession) -> None:
        with self._errors(), self._writer() as conn:
            conn.execute(delete(page_sessions).where(page_sessions.c.expires_at <= session.created_at))
            conn.execute(
                insert(page_sessions).values(
                    id_hash=session.id_hash,
                    credential=session.credential,
                    actor=session.actor,
                    csrf=session.csrf,
                    created_at=session.created_at,
                    expires_at=session.expires_at,
                    flash=session.flash,
                )
            )

    def page_session(self, id_hash: str, at: datetime) -> PageSession | None:
        query = select(page_sessions).where(page_sessions.c.id_hash == id_hash, page_sessions.c.expires_at > at)
        with self._errors(), self._reader() as conn:
            r = conn.execute(query).first()
        if r is None:
            return None
        return PageSession(r.id_hash, r.credential, r.actor, r.csrf, utc(r.created_at), utc(r.expires_at), r.flash)

    def end_session(self, id_hash: str) -> None:
        with self._errors(), self._writer() as conn:
            conn.execute(delete(page_sessions).where(page_sessions.c.id_hash == id_hash))

    def set_flash(self, id_hash: str, message: str) -> None:
        with self._errors(), self._writer() as conn:
            conn.execute(update(page_sessions).where(page_sessions.c.id_hash == id_hash).values(flash=message))

    def take_flash(self, id_hash: str) -> str | None:
        # Read and clear in one write transaction: two pages loading at once cannot both show it.
        with self._errors(), self._writer() as conn:
            message = conn.execute(
                select(page_sessions.c.flash).where(page_sessions.c.id_hash == id_hash).with_for_update()
            ).scalar()
            if message is not None:
                conn.execute(update(page_sessions).where(page_sessions.c.id_hash == id_hash).values(flash=None))
        return message

    # -- failed logins --------------------------------------------------
    def note_login_failure(self, keys: Sequence[str], at: datetime, *, forget_before: datetime) -> None:
        with self._errors(), self._writer() as conn:
            conn.execute(delete(login_failures).where(login_failures.c.at < forget_before))
            if keys:
                conn.execute(insert(login_failures), [{"key": k, "at": at} for k in keys])

    def login_failures(self, keys: Sequence[str], after: datetime) -> dict[str, list[datetime]]:
        if not keys:
            return {}
        query = (
            select(login_failures.c.key, login_failures.c.at)
            .where(login_failures.c.key.in_(list(keys)), login_failures.c.at > after)
            .order_by(login_failures.c.at, login_failures.c.id)
        )
        found: dict[str, list[datetime]] = {}
        with self._errors(), self._reader() as conn:
            for r in conn.execute(query):
                found.setdefault(r.key, []).append(utc(r.at))
        return found

    def clear_login_failures(self, key: str) -> None:
        with self._errors(), self._writer() as conn:
            conn.execute(delete(login_failures).where(login_failures.c.key == key))

    # -- people, database tokens and the access trail --------------------
    def person(self, name: str) -> Person | None:
        with self._errors(), self._reader() as conn:
            r = conn.execute(select(people).where(people.c.name == name)).first()
        return _person(r) if r is not None else None

    def people(self) -> list[Person]:
        with self._errors(), self._reader() as conn:
            return [_person(r) for r in conn.execute(select(people).order_by(people.c.name))]

    def write_person(self, person: Person, changes: Sequence[AccessChange], *, revision: int | None) -> bool:
        values = {
            "password_hash": person.password_hash,
            "roles": canonical_json(sorted(person.roles)),
            "tenants": canonical_json(sorted(person.tenants)) if person.tenants is not None else None,
            "disabled": person.disabled,
            "source": str(person.source),
            "updated_at": person.updated_at,
            "revision": person.revision,
        }
        try:
            with self._errors(), self._writer() as conn:
                if revision is None:
                    if conn.execute(select(people.c.name).where(people.c.name == person.name)).first() is not None:
                        return False
                    conn.execute(insert(people).values(name=person.name, created_at=person.created_at, **values))
                else:
                    moved = conn.execute(
                        update(people)
                        .where(people.c.name == person.name, people.c.revision == revision)
                        .values(**values)
                    )
                    if moved.rowcount != 1:
                        return False
                _trail(conn, changes)
        except StoreError:
            if revision is None and self.person(person.name) is not None:
                return False  # added at the same moment by another writer: its insert won
            raise
        return True

    def api_token(self, sha256: str) -> StoredToken | None:
        with self._errors(), self._reader() as conn:
            r = conn.execute(select(api_tokens).where(api_tokens.c.sha256 == sha256)).first()
        return _stored_token(r) if r is not None else None

    def api_tokens(self, *, actor: str | None = None) -> list[StoredToken]:
        query = select(api_tokens).order_by(api_tokens.c.created_at, api_tokens.c.sha256)
        if actor is not None:
            query = query.where(api_tokens.c.actor == actor)
        with self._errors(), self._reader() as conn:
            return [_stored_token(r) for r in conn.execute(query)]

    def add_api_token(self, token: StoredToken, change: AccessChange) -> bool:
        try:
            with self._errors(), self._writer() as conn:
                if conn.execute(select(api_tokens.c.sha256).where(api_tokens.c.sha256 == token.sha256)).first():
                    return False
                conn.execute(
                    insert(api_tokens).values(
                        sha256=token.sha256,
                        actor=token.actor,
                        roles=canonical_json(sorted(token.roles)),
                        tenants=canonical_json(sorted(token.tenants)) if token.tenants is not None else None,
                        expires_at=token.expires_at,
                        created_at=token.created_at,
                        created_by=token.created_by,
                        revoked_at=token.revoked_at,
                        revoked_by=token.revoked_by,
                    )
                )
                _trail(conn, [change])
        except StoreError:
            if self.api_token(token.sha256) is not None:
                return False
            raise
        return True

    def revoke_api_token(self, sha256: str, at: datetime, by: str, change: AccessChange) -> bool:
        with self._errors(), self._writer() as conn:
            moved = conn.execute(
                update(api_tokens)
                .where(api_tokens.c.sha256 == sha256, api_tokens.c.revoked_at.is_(None))
                .values(revoked_at=at, revoked_by=by)
            )
            if moved.rowcount != 1:
                return False
            _trail(conn, [change])
        return True

    def access_trail(
        self, *, subject: str | None = None, after: int | None = None, limit: int | None = None
    ) -> list[AccessChange]:
        query = select(access_trail).order_by(access_trail.c.id)
        if subject is not None:
            query = query.where(access_trail.c.subject == subject)
        if after is not None:
            query = query.where(access_trail.c.id > after)
        if limit is not None:
            query = query.limit(limit)
        with self._errors(), self._reader() as conn:
            return [
                AccessChange(utc(r.at), r.by, AccessAction(r.action), r.subject, json.loads(r.details), r.id)
                for r in conn.execute(query)
            ]


def _trail(conn: Connection, changes: Sequence[AccessChange]) -> None:
    """Append access-trail entries inside the transaction of the change they record."""
    if changes:
        conn.execute(
            insert(access_trail),
            [
                {
                    "at": c.at,
                    "by": c.by,
                    "action": str(c.action),
                    "subject": c.subject,
                    "details": canonical_json(dict(c.details)),
                }
                for c in changes
            ],
        )


def _names(text: str | None) -> frozenset[str] | None:
    return frozenset(json.loads(text)) if text is not None else None


def _person(r: Row[Any]) -> Person:
    return Person(
        r.name,
        frozenset(json.loads(r.roles)),
        _names(r.tenants),
        r.password_hash,
        bool(r.disabled),
        Source(r.source),
        utc(r.created_at),
        utc(r.updated_at),
        int(r.revision),
    )


def _stored_token(r: Row[Any]) -> StoredToken:
    return StoredToken(
        r.sha256,
        r.actor,
        frozenset(json.loads(r.roles)),
        _names(r.tenants),
        utc(r.expires_at) if r.expires_at is not None else None,
        utc(r.created_at),
        r.created_by,
        utc(r.revoked_at) if r.revoked_at is not None else None,
        r.revoked_by,
    )
