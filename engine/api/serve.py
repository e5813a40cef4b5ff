"""`railyard serve`: one `Engine` whose roles come from the tokens file, under uvicorn."""

from __future__ import annotations

from engine.api import settings
from engine.api.app import create_app
from engine.api.tokens import load_tokens
from engine.runtime import config
from engine.runtime.engine import Engine


def serve(host: str = "127.0.0.1", port: int = 8080) -> None:
    import uvicorn

    tokens = load_tokens(settings.tokens_file())
    max_body = settings.max_body()  # every setting is checked before anything is opened
    with Engine(config.database_url(), authoriser=tokens) as engine:
        app = create_app(
            engine,
            tokens,
            session_secret=settings.session_secret(),
            secure_cookies=settings.secure_cookies(),
            max_body=max_body,
        )
        uvicorn.run(app, host=host, port=port, log_level="info", proxy_headers=False, server_header=False)
