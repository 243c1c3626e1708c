"""Request bodies checked before any route sees them (pure ASGI, in front of FastAPI).

For a POST, PUT or PATCH with a body under `/v1/` or `/sparkgate/`:

    Content-Length over limits.max_body_bytes, or more bytes read  -> 413 request_too_large
    Content-Type neither JSON nor absent nor curl's form default  -> 400 unsupported_content_type
    not UTF-8                                                      -> 400 invalid_encoding
    arrays/objects nested deeper than limits.max_json_depth        -> 400 json_too_deep

then the body is handed on, marked `application/json`, to be parsed by its route (not JSON:
400 invalid_json there; NaN and Infinity are refused by the request models). OpenAI
answers a body it cannot read as JSON with a 400 too; a missing Content-Type, and curl's
`-d` default (form encoding), are read as JSON, as the README's curl examples send them.
Errors are answered through gateway/errors.py like every other.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import GatewayError, MalformedBody, RequestTooLarge, answer

PREFIXES = ("/v1/", "/sparkgate/")
METHODS = frozenset({"POST", "PUT", "PATCH"})
# Read as JSON: no Content-Type, JSON's own, and curl -d's default.
_LENIENT_TYPES = frozenset({"", "application/json", "application/x-www-form-urlencoded"})

# Everything but brackets goes; `{}` become `[]` (nesting is nesting; a mismatch is the parser's to report).
_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """Whether the body nests arrays/objects deeper than `limit`, without parsing it (and so
    without recursion: a parser recursing into 100,000 brackets is what this guards).

    All at C speed (bytes methods, no per-character Python): strings are cut out (escapes
    first, then every other piece between quotes), then all but the brackets; each pass
    removes the innermost pairs, one level. Brackets left after `limit` passes: too deep.
    A wide body takes a pass or two; only a deep one takes up to `limit`.
    """
    if body.count(b"[") + body.count(b"{") <= limit:
        return False  # cannot nest deeper than its brackets (the usual small request)
    text = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    shape = b"".join(text.split(b'"')[::2]).translate(_BRACKETS, _NOT_BRACKETS)
    if b"[" * (limit + 1) in shape:
        return True  # the usual attack, `[[[[...`, found at once
    for _ in range(limit):
        reduced = shape.replace(b"[]", b"")
        if not reduced or len(reduced) == len(shape):
            return False  # all levels removed, or unbalanced (not JSON, which the parser reports)
        shape = reduced
    return b"[]" in shape


def check_body(body: bytes, max_depth: int) -> None:
    """Raise MalformedBody unless `body` is UTF-8 within the depth limit. Whether it is JSON is
    the route's parse to say (400 invalid_json, through the same mapping): parsing it here
    too would double the cost of the largest bodies."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MalformedBody(f"The request body is not valid UTF-8 (byte {e.start}).", code="invalid_encoding") from None
    if json_depth_exceeds(body, max_depth):
        raise MalformedBody(
            f"The JSON body nests arrays and objects deeper than {max_depth} levels.", code="json_too_deep"
        )


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


class BodyLimitsMiddleware:
    """Read an API request's body (at most max_body_bytes), check it, hand it on as JSON."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_json_depth: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in METHODS or not scope["path"].startswith(PREFIXES):
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
        except GatewayError as err:
            await answer(Request(scope), err)(scope, receive, send)
            return
        if body is None:  # the client left while sending
            return
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-type", b"content-length")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        replayed = False

        async def replay() -> Message:
            # The body once, then the client's own messages (a disconnect, which routes wait on).
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(dict(scope, headers=headers), replay, send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes | None:
        length = _header(scope, b"content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_body_bytes:
            raise _too_large(self.max_body_bytes)  # said before a byte of it is read
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:  # chunked, or a Content-Length that understated it
                raise _too_large(self.max_body_bytes)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body:  # an empty body is left to the route (a missing body is its error to name)
            kind = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
            if kind not in _LENIENT_TYPES and not kind.endswith("+json"):
                raise MalformedBody(
                    f"Unsupported Content-Type '{kind}': send the request body as application/json.",
                    code="unsupported_content_type",
                )
            check_body(body, self.max_json_depth)
        return body


def _too_large(limit: int) -> RequestTooLarge:
    return RequestTooLarge(f"The request body is larger than this server accepts ({limit} bytes).")
