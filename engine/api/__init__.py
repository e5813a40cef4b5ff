"""`railyard serve`: the HTTP API and the back-office pages over one `Engine`.

`create_app(engine, tokens)` builds the FastAPI application (tests build it
in-process); `engine.api.app.serve` runs it under uvicorn. The modules:
`app` (the application, its middleware, error handlers, settings and `serve`),
`auth` (who is calling: bearer tokens, page sessions), `tokens` (the tokens
file), `schemas` (what crosses the wire, and the HTTP status of every code),
`views` (what the pages show) and `routes` (the API and the pages).
"""

from engine.api.app import create_app
from engine.api.schemas import STATUS_BY_CODE
from engine.api.tokens import Principal, TokenTable, load_tokens

__all__ = ["STATUS_BY_CODE", "Principal", "TokenTable", "create_app", "load_tokens"]
