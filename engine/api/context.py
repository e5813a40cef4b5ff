"""What every request handler needs, held once on the application: the engine, the tokens, the cookie signer."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from engine.api.session import Signer
from engine.api.tokens import TokenTable
from engine.runtime.engine import Engine


@dataclass(frozen=True, slots=True)
class Context:
    engine: Engine
    tokens: TokenTable
    signer: Signer
    #: Set the cookies' Secure flag: on whenever the server is reached over HTTPS (a proxy in front of it).
    secure_cookies: bool = False


def context(request: Request) -> Context:
    ctx: Context = request.app.state.railyard
    return ctx
