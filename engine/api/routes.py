"""The back-office pages: login, the approvals inbox, the task list and the task page.

Server-rendered, no JavaScript. Every POST carries the session's CSRF token;
decisions are made by the same `Engine.approve` / `Engine.reject` the API
calls, as the session's actor, and a refusal is shown with its code. Every
decision form carries the seq the page was rendered at (`seq`): if the task
moved since, the decision is refused (409 CONCURRENCY_CONFLICT, naming the
state it is in now) instead of landing on a task the person did not see.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from engine.api.auth import Ctx, PageSession, Session, require_writer
from engine.api.context import Context
from engine.api.listing import TaskFilter, list_tasks
from engine.api.pageviews import inbox, task_page
from engine.api.preconditions import acting_on, precondition
from engine.api.schemas import MAX_SEQ, NAME_PATTERN, STATE_PATTERN, TASK_ID_PATTERN
from engine.api.session import LOGIN_COOKIE, LOGIN_SECONDS, SESSION_COOKIE, SESSION_SECONDS, same_token
from engine.api.templating import render
from engine.core.definition import Status
from engine.core.errors import Code, Refused

router = APIRouter(include_in_schema=False)

TaskId = Annotated[str, Path(pattern=TASK_ID_PATTERN)]
Csrf = Annotated[str, Form(max_length=200)]
#: The seq a decision form was rendered at. Optional only so a hand-made post still gets the engine's own refusal;
#: the pages always send it.
Seq = Annotated[int | None, Form(ge=1, le=MAX_SEQ)]


def _cookie(response: Response, ctx: Context, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name, value, max_age=max_age, httponly=True, samesite="strict", secure=ctx.secure_cookies, path="/"
    )


def _check_csrf(session: Session, presented: str) -> None:
    if not same_token(session.csrf, presented):
        raise Refused(
            "the form's CSRF token is missing or stale: reload the page and try again",
            code=Code.FORBIDDEN,
            reason="csrf",
        )


@router.get("/")
def home() -> Response:
    return RedirectResponse("/inbox", status_code=303)


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, ctx: Ctx) -> Response:
    cookie, csrf = ctx.signer.login()
    response = render(request, "login.html", session=None, csrf=csrf, error=None)
    _cookie(response, ctx, LOGIN_COOKIE, cookie, LOGIN_SECONDS)
    return response


@router.post("/login")
def login(request: Request, ctx: Ctx, token: Annotated[str, Form(max_length=500)], csrf: Csrf) -> Response:
    if not same_token(ctx.signer.read_login(request.cookies.get(LOGIN_COOKIE)), csrf):
        raise Refused("the login form expired: reload the page and try again", code=Code.FORBIDDEN, reason="csrf")
    principal = ctx.tokens.authenticate(token.strip()) if token.strip() else None
    if principal is None:
        cookie, fresh = ctx.signer.login()
        again = render(
            request, "login.html", 401, session=None, csrf=fresh, error="That token is not one this server knows."
        )
        _cookie(again, ctx, LOGIN_COOKIE, cookie, LOGIN_SECONDS)
        return again
    session_cookie, _data = ctx.signer.session(principal.token_hash)
    response = RedirectResponse("/inbox", status_code=303)
    _cookie(response, ctx, SESSION_COOKIE, session_cookie, SESSION_SECONDS)
    response.delete_cookie(LOGIN_COOKIE, path="/")
    return response


@router.post("/logout")
def logout(session: PageSession, csrf: Csrf) -> Response:
    _check_csrf(session, csrf)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.get("/inbox", response_class=HTMLResponse)
def inbox_page(
    request: Request, ctx: Ctx, session: PageSession, role: Annotated[str | None, Query(max_length=200)] = None
) -> Response:
    items = inbox(ctx.engine, session.principal, role or None)
    mine = [i for i in items if i.can_decide]
    others = [i for i in items if not i.can_decide]
    return render(request, "inbox.html", session=session, mine=mine, others=others, role=role or "")


@router.get("/tasks", response_class=HTMLResponse)
def tasks_page(
    request: Request,
    ctx: Ctx,
    session: PageSession,
    workflow: Annotated[str, Query(pattern=f"^$|{NAME_PATTERN}")] = "",
    state: Annotated[str, Query(pattern=f"^$|{STATE_PATTERN}")] = "",
    status: Annotated[str, Query(pattern="^(|runnable|blocked|terminal)$")] = "",
) -> Response:
    found = list_tasks(ctx.engine.store, TaskFilter(workflow or None, state or None, status or None, 200))
    names = list(dict.fromkeys(wf.name for wf in ctx.engine.registry))
    states = sorted({s.name for wf in ctx.engine.registry for s in wf.all_states})
    return render(
        request,
        "tasks.html",
        session=session,
        tasks=found,
        workflows=names,
        states=states,
        statuses=[str(s) for s in Status],
        chosen={"workflow": workflow, "state": state, "status": status},
    )


@router.get("/tasks/{task_id}", response_class=HTMLResponse)
def task_page_view(
    request: Request,
    task_id: TaskId,
    ctx: Ctx,
    session: PageSession,
    done: Annotated[str, Query(pattern="^(|approved|rejected)$")] = "",
) -> Response:
    page = task_page(ctx.engine, task_id, session.principal)
    return render(request, "task.html", session=session, page=page, done=done)


@router.post("/tasks/{task_id}/approve")
def approve(
    request: Request,
    task_id: TaskId,
    ctx: Ctx,
    session: PageSession,
    csrf: Csrf,
    digest: Annotated[str, Form(max_length=64)] = "",
    comment: Annotated[str, Form(max_length=2000)] = "",
    seq: Seq = None,
) -> Response:
    _check_csrf(session, csrf)
    require_writer(session.principal)
    pre = precondition(None, seq)
    with acting_on(ctx.engine, task_id, pre):
        ctx.engine.approve(
            task_id,
            actor=session.principal.actor,
            prepared_digest=digest or None,
            comment=comment,
            expected_seq=pre.expected_seq,
        )
    return RedirectResponse(f"/tasks/{task_id}?done=approved", status_code=303)


@router.post("/tasks/{task_id}/reject")
def reject(
    request: Request,
    task_id: TaskId,
    ctx: Ctx,
    session: PageSession,
    csrf: Csrf,
    reason: Annotated[str, Form(min_length=1, max_length=2000)],
    seq: Seq = None,
) -> Response:
    _check_csrf(session, csrf)
    require_writer(session.principal)
    pre = precondition(None, seq)
    with acting_on(ctx.engine, task_id, pre):
        ctx.engine.reject(task_id, actor=session.principal.actor, reason=reason, expected_seq=pre.expected_seq)
    return RedirectResponse(f"/tasks/{task_id}?done=rejected", status_code=303)
