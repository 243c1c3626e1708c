"""Fetching an image a client named by http(s) URL, where the operator allows it
(settings `image_fetch`): only allow-listed hosts, at every redirect; never a private, loopback
or link-local address unless the operator named that host; a byte limit read as it streams;
one deadline for the whole fetch.

The address check runs where the connection is made (a network backend that resolves the
host, refuses the addresses it may not reach, and connects to the address it checked), so a
name that resolves to a public address when checked and a private one when connected (DNS
rebinding) cannot slip through, and every redirect's connection is checked alike. TLS still
verifies the certificate against the URL's host name.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpcore

from gateway.errors import InvalidRequest, RequestTooLarge
from gateway.settings import ImageFetchSettings

REDIRECTS = frozenset({301, 302, 303, 307, 308})


def _allowed(host: str, patterns: Iterable[str]) -> bool:
    host = host.lower().rstrip(".")
    for pattern in patterns:
        p = pattern.lower().rstrip(".")
        if p.startswith("*.") and host.endswith(p[1:]) and host != p[2:]:
            return True
        if host == p:
            return True
    return False


def public(address: str) -> bool:
    """Whether an address is one the open internet routes (not private, loopback, link-local,
    multicast, reserved or unspecified; an IPv4-mapped IPv6 address as its IPv4)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class _Refused(Exception):
    """The connection's address is not one this fetch may reach."""


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, connecting only to addresses the settings allow."""

    def __init__(self, settings: ImageFetchSettings) -> None:
        self._settings = settings
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        private_ok = _allowed(host, self._settings.private_hosts)
        reachable = [a for a in addresses if private_ok or public(a)]
        if not reachable:
            raise _Refused(f"{host} resolves to {', '.join(addresses)}, which this server may not fetch from")
        for address in reachable[:-1]:  # as a browser would: the next address if one is down
            try:
                return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError:
                continue
        return await self._inner.connect_tcp(reachable[-1], port, timeout, local_address, socket_options)

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise _Refused("no unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _failed(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="image_fetch_failed")


def check_url(url: str, settings: ImageFetchSettings, param: str) -> str:
    """The URL's host, if this server fetches from it; else a 400 that says why."""
    if not settings.enabled:
        raise InvalidRequest(
            "This server does not fetch image URLs (the operator has not turned image_fetch on): "
            "send the image inline as a base64 data URL (data:image/png;base64,...).",
            param=param,
            code="image_url_not_allowed",
        )
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidRequest(
            "An image URL must be http(s) or a base64 data URL.", param=param, code="image_url_not_allowed"
        )
    if not _allowed(host, settings.allow_hosts):
        raise InvalidRequest(
            f"This server does not fetch images from '{host}' (not in image_fetch.allow_hosts).",
            param=param,
            code="image_url_not_allowed",
        )
    return host


async def fetch(url: str, settings: ImageFetchSettings, max_bytes: int, param: str) -> bytes:
    """The image's bytes: at most `max_bytes` (413 beyond), within the settings' deadline."""
    limit = min(max_bytes, settings.max_bytes)
    try:
        async with asyncio.timeout(settings.timeout_s):
            async with httpcore.AsyncConnectionPool(network_backend=_GuardedBackend(settings)) as pool:
                for _ in range(settings.max_redirects + 1):
                    check_url(url, settings, param)
                    next_url = await _get(pool, url, limit, param)
                    if isinstance(next_url, bytes):
                        return next_url
                    url = next_url
    except TimeoutError:
        raise _failed(f"Fetching the image took longer than {settings.timeout_s:g} s.", param) from None
    except _Refused as e:
        raise _failed(f"The image URL's host is refused: {e}.", param) from None
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol, OSError) as e:
        raise _failed(f"Fetching the image failed: {type(e).__name__}.", param) from None
    raise _failed(f"The image URL redirected more than {settings.max_redirects} times.", param)


async def _get(pool: httpcore.AsyncConnectionPool, url: str, limit: int, param: str) -> bytes | str:
    """One hop: the body, or the URL it redirects to."""
    headers = [(b"Accept", b"image/*"), (b"User-Agent", b"sparkgate")]
    async with pool.stream("GET", url, headers=headers) as response:
        if response.status in REDIRECTS:
            location = dict((k.lower(), v) for k, v in response.headers).get(b"location")
            if location is None:
                raise _failed(f"The image URL answered {response.status} without a Location.", param)
            return urljoin(url, location.decode("latin-1"))
        if response.status != 200:
            raise _failed(f"The image URL answered HTTP {response.status}.", param)
        body = bytearray()
        async for chunk in response.aiter_stream():
            body += chunk
            if len(body) > limit:
                raise RequestTooLarge(
                    f"The image at the URL is larger than {limit:,} bytes.", param=param, code="image_too_large_bytes"
                )
        return bytes(body)
