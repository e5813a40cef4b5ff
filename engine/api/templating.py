"""The Jinja2 environment of the pages: autoescaping on for every template, whatever its name.

Everything a model or a tool wrote reaches the pages as data and is escaped;
no template marks anything `|safe`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
templates = Jinja2Templates(env=_env)


def render(request: Request, name: str, status_code: int = 200, **values: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, values, status_code=status_code)
