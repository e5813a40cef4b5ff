"""What the SDKs' aiohttp transport says about a failed connection, read back to the engine's codes.

Both SDKs run on aiohttp here (their `DefaultAioHttpClient`, chosen for the CPU it saves a worker with many
calls in flight). Their adapter from aiohttp's errors to httpx's maps a refused connection
(`aiohttp.ClientConnectorError`, a subclass of `ClientConnectionError`) to `httpx.ConnectTimeout`, so the SDK
raises its timeout error for a port nobody listens on. A timeout is retried as the provider being slow; a
refused connection is the provider being away (`PROVIDER_ERROR`), as it was on the default transport.
"""

from __future__ import annotations

import aiohttp


def connection_failed(error: BaseException) -> bool:
    """Whether an SDK's timeout error was caused by a connection that failed rather than one that timed out."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, aiohttp.ClientConnectorError) and not isinstance(cause, aiohttp.ServerTimeoutError):
            return True
        cause = cause.__cause__
    return False
