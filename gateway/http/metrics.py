"""GET /metrics: Prometheus text format (gateway/metrics.py).

Access: with `metrics.token` unset, only loopback clients may scrape (no key); with it set,
anyone presenting `Authorization: Bearer <token>`, and nobody without it. The token is
compared in constant time and its failures count toward the client's failed-auth block. The route exists
only when `metrics.enabled` (else 404, like any unknown path).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import Annotated

from fastapi import APIRouter, Header, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.auth import bearer
from gateway.errors import AuthenticationFailed, PermissionDenied
from gateway.http.deps import State, client_address

router = APIRouter()


def _loopback(request: Request) -> bool:
    host = request.client.host if request.client is not None else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@router.get("/metrics", include_in_schema=False)
async def metrics(state: State, request: Request, authorization: Annotated[str | None, Header()] = None) -> Response:
    m = state.metrics
    assert m is not None  # the route is mounted only when metrics are enabled
    token = m.settings.token
    if token is not None:

        async def check() -> None:
            # Digests of equal length: the comparison's time tells nothing, not even the length.
            given = hashlib.sha256(bearer(authorization).encode()).digest()
            if not hmac.compare_digest(given, hashlib.sha256(token.encode()).digest()):
                raise AuthenticationFailed("A valid metrics token is required: Authorization: Bearer <metrics.token>.")

        await state.failed_auth.guarded(client_address(request), check)
    elif not _loopback(request):
        raise PermissionDenied("/metrics is served to loopback clients only unless metrics.token is set.")
    return Response(m.render(), media_type=CONTENT_TYPE_LATEST)
