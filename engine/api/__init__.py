"""`railyard serve`: the HTTP API and the back-office pages over one `Engine`.

`create_app(engine, tokens)` builds the FastAPI application (tests build it
in-process); `engine.api.serve.serve` runs it under uvicorn.
"""

from engine.api.app import create_app
from engine.api.tokens import Principal, TokenTable, load_tokens

__all__ = ["Principal", "TokenTable", "create_app", "load_tokens"]
