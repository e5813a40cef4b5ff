"""The HTTP transport under both SDKs, and what it says about a failed connection, read back to the engine's codes.

Both SDKs run on aiohttp here (their `DefaultAioHttpClient`, chosen for the CPU it saves a worker with many
calls in flight). Their adapters from aiohttp's errors to httpx's map every `aiohttp.ClientConnectionError`
(a refused connection, a server that hung up, a reset socket) to `httpx.ConnectTimeout`, so the SDK raises
its timeout error for a provider that is away or dropped the call. A timeout is retried as the provider being
slow; a failed connection is `PROVIDER_ERROR`, as it was on the default transport.

The pool: aiohttp's default caps a client at 100 connections and the SDKs' at 1,000; a worker holds as many
calls as its `--concurrency`, each on a connection of its own (HTTP/1.1), so the cap is set above any worker's.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from dataclasses import replace
from typing import Any

import aiohttp
import httpx2

from engine.core.errors import Code, RailyardError
from engine.core.model_interface import ModelResponse

#: Connections one SDK client may hold: above any worker's calls in flight (aiohttp's own default is 100).
MAX_CONNECTIONS = 100_000
LIMITS = httpx2.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS)

#: Where `keep_quota_headers` leaves what a provider's answer said of its rate limits, for the call awaiting it:
#: flow control (`engine.runtime.flow`) sets a dict here around a call under a quota; unset, the hook does nothing.
QUOTA_HEADERS: ContextVar[dict[str, str] | None] = ContextVar("railyard_quota_headers", default=None)


async def keep_quota_headers(response: httpx2.Response) -> None:
    """A response hook of both SDKs' HTTP clients: the `x-ratelimit-*` and `anthropic-ratelimit-*` headers of the
    answer, for a caller that asked (`QUOTA_HEADERS`). The SDKs' `post(..., cast_to=object)` hands the adapters
    the body only; this is the one place the headers of an answer are seen."""
    kept = QUOTA_HEADERS.get()
    if kept is None:
        return
    for name, value in response.headers.items():
        lowered = name.lower()
        if lowered.startswith(("x-ratelimit-", "anthropic-ratelimit-")):
            kept[lowered] = value


#: The HTTP clients' event hooks (`DefaultAioHttpClient(event_hooks=...)` in each adapter).
EVENT_HOOKS = {"response": [keep_quota_headers]}


class Endpoint:
    """One path joined to an SDK client's `base_url` as the SDK joins a relative one (`_prepare_url`), as an
    absolute URL, once per client: the adapters pass it so, which spares the SDK parsing and joining it again on
    every call (35 µs of a worker's turn, measured in issue #18's profile)."""

    def __init__(self, path: str) -> None:
        self._path = path.lstrip("/").encode("ascii")
        #: The last client asked about and its URL, in one tuple: threads with loops of their own read a
        #: consistent pair.
        self._last: tuple[object, str] = (None, "")

    def of(self, client: Any) -> str:
        last = self._last
        if last[0] is not client:
            base: httpx2.URL = client.base_url
            last = self._last = (client, str(base.copy_with(raw_path=base.raw_path + self._path)))
        return last[1]


def connection_failed(error: BaseException) -> bool:
    """Whether an SDK's timeout error was caused by a connection that failed rather than one that timed out."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(
            cause, (aiohttp.ServerTimeoutError, TimeoutError)
        ):
            return True
        cause = cause.__cause__
    return False


def json_object(value: object) -> dict[str, Any]:
    """A JSON object from the wire, as the SDK's `post(..., cast_to=object)` hands it over. The adapters send
    through `post` rather than `create`, whose typed transform of the body and pydantic models of the answer cost
    a worker a third of its CPU (docs/performance.md). The SDK hands over the text of a body not labelled JSON
    (some compatible servers send `text/plain`, or no content type): it is read as JSON all the same, as `create`
    did; anything else (a list, text that is not JSON) is malformed."""
    if isinstance(value, str | bytes):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise TypeError(f"a {type(value).__name__}, not a JSON object")
    return value


def no_credentials(provider: str, detail: str) -> RailyardError:
    """The SDK resolved no credentials at all: the deployment's configuration, not a failure of one call.

    Raised from the adapter instead of a `ModelError`, so the step records nothing and stops
    (`MODEL_NOT_CONFIGURED`: `railyard run` exits 2, a worker leaves the task untouched for a worker that has a
    key). As `PROVIDER_AUTH`, not retried, it moved every task a keyless worker claimed to `~provider_error`.
    Which sources count is the SDK's to say (keys, tokens, profiles, workload identity), not the engine's: a
    key the provider refuses is still `PROVIDER_AUTH`."""
    return RailyardError(f"{provider}: no credentials: {detail}", code=Code.MODEL_NOT_CONFIGURED)


def answered(response: ModelResponse, body: dict[str, Any]) -> ModelResponse:
    """`response` with the model and the id the provider gave its answer (a body, a stream's first chunk, or the
    Anthropic stream's `message_start` message): what traces and the turn record of who answered."""
    model, answer_id = body.get("model"), body.get("id")
    return replace(
        response,
        response_model=model if isinstance(model, str) and model else None,
        response_id=answer_id if isinstance(answer_id, str) and answer_id else None,
    )
