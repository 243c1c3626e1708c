"""GET /dashboard: one static page (plain JS and inline SVG, no build step), and the JSON it
polls once a second, GET /sparkgate/dashboard/data (admin keys only).

The page itself carries no data and needs no key: it asks for the admin key, keeps it in
the tab's sessionStorage and sends it as `Authorization: Bearer` (never in a URL).
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from gateway.http import dashboard_data
from gateway.http.deps import Admin, State

router = APIRouter()


@cache
def _page() -> str:
    return resources.files("gateway").joinpath("static/dashboard.html").read_text(encoding="utf-8")


@router.get("/dashboard", include_in_schema=False)
async def page() -> HTMLResponse:
    return HTMLResponse(
        _page(),
        headers={
            "Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
            "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
            "Referrer-Policy": "no-referrer",
        },
    )


@router.get("/sparkgate/dashboard/data")
async def data(state: State, admin: Admin) -> dict[str, Any]:
    return await dashboard_data.data(state)
