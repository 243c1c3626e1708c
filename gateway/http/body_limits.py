"""Request bodies checked before any route sees them (pure ASGI, in front of FastAPI).

For a POST, PUT or PATCH with a body under `/v1/` or `/sparkgate/`:

    Content-Length over limits.max_body_bytes, or more bytes read  -> 413 request_too_large
    Content-Encoding zstd, gzip or deflate (or several, in order)  -> decoded, in chunks: more
                                                                      than max_body_bytes decoded
                                                                      -> 413 request_too_large
                                                                      (a decompression bomb stops
                                                                      there); corrupt -> 400
                                                                      invalid_content_encoding
    another Content-Encoding                                       -> 415 unsupported_content_encoding
    Content-Type neither JSON nor absent nor curl's form default  -> 400 unsupported_content_type
    not UTF-8                                                      -> 400 invalid_encoding
    arrays/objects nested deeper than limits.max_json_depth        -> 400 json_too_deep

then the body is handed on, decoded and marked `application/json` (without its
Content-Encoding), to be parsed by its route (not JSON:
400 invalid_json there; NaN and Infinity are refused by the request models). OpenAI
answers a body it cannot read as JSON with a 400 too; a missing Content-Type, and curl's
`-d` default (form encoding), are read as JSON, as the README's curl examples send them.
Codex CLI may send its bodies zstd-compressed. Errors are answered through gateway/errors.py
like every other.
"""

from __future__ import annotations

import asyncio
import zlib

import zstandard
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import GatewayError, MalformedBody, RequestTooLarge, UnsupportedEncoding
from gateway.http.errors import answer

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


# --- Content-Encoding ---------------------------------------------------------------------

CODINGS = ("zstd", "gzip", "x-gzip", "deflate", "identity")
DECODE_CHUNK = 64 * 1024  # decoded bytes produced at a time (the size is checked after each)
_ZSTD_MAX_WINDOW = 1 << 27  # zstd's own default limit (128 MiB)


def _corrupt(coding: str, why: str = "") -> MalformedBody:
    return MalformedBody(
        f"The request body is not valid {coding} data (Content-Encoding: {coding}){why}.",
        code="invalid_content_encoding",
    )


def _decoded_too_large(limit: int) -> RequestTooLarge:
    return RequestTooLarge(f"The decoded request body is larger than this server accepts ({limit} bytes).")


def _inflate(body: bytes, coding: str, limit: int) -> bytes:
    """gzip (its members one after another) or deflate (zlib's format, or raw as some clients
    send it), never more than `limit` bytes out."""
    if coding == "deflate":
        zlib_header = len(body) >= 2 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0
        wbits = zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS
    else:
        wbits = 16 + zlib.MAX_WBITS
    out: list[bytes] = []
    size = 0
    data = body
    d = zlib.decompressobj(wbits)
    try:
        while True:
            chunk = d.decompress(data, DECODE_CHUNK)
            size += len(chunk)
            if size > limit:
                raise _decoded_too_large(limit)
            out.append(chunk)
            data = d.unconsumed_tail
            if d.eof:
                if not d.unused_data:
                    break
                if wbits < 0 or wbits == zlib.MAX_WBITS:
                    raise _corrupt(coding, ": bytes after its end")
                data, d = d.unused_data, zlib.decompressobj(wbits)  # the next gzip member
            elif not chunk and not data:
                raise _corrupt(coding, ": it ends before its end")
    except zlib.error as e:
        raise _corrupt(coding, f": {e}") from None
    return b"".join(out)


def _unzstd(body: bytes, limit: int) -> bytes:
    """zstd frames, never more than `limit` bytes out (and a window no larger than that needs)."""
    # A window as large as the limit (at least zstd level 19's 8 MiB): more is never needed to
    # write a body within it, and only a bomb asks for more memory.
    window = min(_ZSTD_MAX_WINDOW, 1 << max(23, (limit - 1).bit_length()))
    dctx = zstandard.ZstdDecompressor(max_window_size=window)
    out: list[bytes] = []
    size = 0
    try:
        with dctx.stream_reader(body, read_across_frames=True) as reader:
            while chunk := reader.read(DECODE_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise _decoded_too_large(limit)
                out.append(chunk)
        # The reader ends quietly at a cut frame: each frame must end (what they decode to is
        # known now to be within the limit).
        rest = body
        while rest:
            frame = dctx.decompressobj()
            frame.decompress(rest)
            if not frame.eof:
                raise _corrupt("zstd", ": it ends before its end")
            rest = frame.unused_data
    except zstandard.ZstdError as e:
        if "too much memory" in str(e):  # a frame whose window exceeds `window`
            raise _decoded_too_large(limit) from None
        raise _corrupt("zstd", f": {e}") from None
    return b"".join(out)


def decode_body(body: bytes, encoding: str, limit: int) -> bytes:
    """The body a Content-Encoding header describes, decoded (codings are undone last first);
    at most `limit` bytes at every step, or RequestTooLarge before more is produced."""
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
    for coding in codings:
        if coding not in CODINGS:
            raise UnsupportedEncoding(
                f"Unsupported Content-Encoding '{coding}': send the body as is, or as zstd, gzip or deflate."
            )
    for coding in reversed(codings):
        if coding == "zstd":
            body = _unzstd(body, limit)
        elif coding != "identity":
            body = _inflate(body, coding, limit)
    return body


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
        drop = (b"content-type", b"content-length", b"content-encoding")
        headers = [(k, v) for k, v in scope["headers"] if k not in drop]
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
        encoding = ", ".join(v.decode("latin-1") for k, v in scope["headers"] if k == b"content-encoding")
        if body and encoding and encoding.strip().lower() != "identity":
            # Off the event loop: up to max_body_bytes of decoding (milliseconds).
            body = await asyncio.to_thread(decode_body, body, encoding, self.max_body_bytes)
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
