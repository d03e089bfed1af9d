"""Who may change the proxy's engines, and which engines it takes (`/api/v1/proxy/engines`).

An engine receives every prompt routed to it, the upstream's API key where it gets one, and its answers become
training data: adding one is the operator's act, never an agent's. So changing engines needs a token even on a
loopback server without `--token`: the operator's, or the admin token a trainer gives the server it starts
(`agl serve --admin-token-file`). Reading the engines stays open as every other read is.

An engine added at run time must be a well-formed base URL (`agl.server.engines.engine_url`), on a listed host
when the operator lists hosts (`--engine-host`), not a link-local address (cloud metadata) unless listed, and not
agl itself: not this server's own address, and not any URL whose model list answers with agl's header.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
import urllib.parse
from typing import Any

import aiohttp
from starlette.requests import Request

from agl.server.engines import EngineUrlError, engine_url, link_local
from agl.server.proxy import SERVER_HEADER, LLMProxy
from agl.server.settings import ServerSettings

PROBE_TIMEOUT_S = 3.0


class EngineRefused(Exception):
    """An engine change refused: `status` and a message that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def check_operator(request: Request, settings: ServerSettings) -> None:
    """Raise `EngineRefused` unless the request carries the operator's token or the admin token. With `--token`
    the bearer middleware has already let only the operator's token through to this route."""
    if settings.token:
        return
    given = request.headers.get("authorization", "")
    scheme, _, credential = given.strip().partition(" ")
    admin = (settings.admin_token or "").encode()
    if admin and scheme.lower() == "bearer" and hmac.compare_digest(credential.strip().encode(), admin):
        return
    raise EngineRefused(
        403,
        "changing the proxy's engines needs the operator's token, even on loopback: start agl serve with --token "
        "(or --admin-token-file) and send it as 'Authorization: Bearer <token>'",
    )


def _is_own_address(host: str, port: int, request: Request) -> bool:
    """The engine's host and port are where this server listens (the address the request came in on, or a
    loopback or wildcard equivalent of it)."""
    server = request.scope.get("server")
    if not server or port != server[1]:
        return False
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)}
    except OSError:
        return False
    bound = server[0]
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        if address == bound or ip.is_loopback or ip.is_unspecified:
            return True
    return False


async def admitted_url(url: str, request: Request, settings: ServerSettings, proxy: LLMProxy) -> str:
    """`url` normalised, if the proxy may add it as an engine; else `EngineRefused` says why."""
    try:
        url = engine_url(url)
    except EngineUrlError as exc:
        raise EngineRefused(422, str(exc)) from None
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "").lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    listed = {h.lower() for h in settings.engine_hosts}
    if listed and host not in listed:
        raise EngineRefused(
            403, f"engine host {host!r} is not among the hosts this server takes engines on: {sorted(listed)}"
        )
    if link_local(host) and host not in listed:
        raise EngineRefused(
            403,
            f"engine host {host!r} is a link-local address (where clouds serve credentials): list it with --engine-host",
        )
    if _is_own_address(host, port, request):
        raise EngineRefused(422, f"{url} is this agl server itself: an engine must be a model server")
    if await _answers_as_agl(url, proxy):
        raise EngineRefused(422, f"{url} answers as an agl server: an engine must be a model server, not agl")
    return url


async def _answers_as_agl(url: str, proxy: LLMProxy) -> bool:
    """Whether the URL's model list comes back with agl's header. An engine that does not answer yet (a server
    still starting) is taken: calls that come back to this server are refused there too (`VIA_HEADER`)."""
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
    headers: dict[str, Any] = {}
    try:
        async with proxy.http().get(f"{url}/models", timeout=timeout, allow_redirects=False, headers=headers) as resp:
            return SERVER_HEADER in resp.headers
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False
