"""Images by URL (gateway/image_fetch.py) against a local HTTP server: the allow-list at every
hop, private addresses refused unless the host is named, the byte limit, the deadline."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gateway.errors import InvalidRequest, RequestTooLarge
from gateway.image_fetch import check_url, fetch, public
from gateway.settings import ImageFetchSettings

IMAGE = b"\x89PNG fake bytes"
RELEASE = threading.Event()  # the stalling handler waits for it (set at teardown)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        port = self.server.server_address[1]
        if self.path == "/img":
            self._send(200, IMAGE)
        elif self.path == "/big":
            self._send(200, b"\0" * 5000)
        elif self.path == "/to-ip":  # a redirect to the same server by its loopback address
            self._redirect(f"http://127.0.0.1:{port}/img")
        elif self.path == "/loop":
            self._redirect("/loop")
        elif self.path == "/stall":
            RELEASE.wait(30)
            self._send(200, IMAGE)
        else:
            self._send(404, b"no")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, to: str) -> None:
        self.send_response(302)
        self.send_header("Location", to)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    RELEASE.set()
    server.shutdown()


def on(**kw: object) -> ImageFetchSettings:
    base: dict[str, object] = {"enabled": True, "allow_hosts": ("localhost",), "private_hosts": ("localhost",)}
    return ImageFetchSettings.model_validate(base | kw)


def test_off_by_default_and_the_refusal_says_how_to_send_an_image() -> None:
    with pytest.raises(InvalidRequest) as e:
        check_url("https://example.com/a.png", ImageFetchSettings(), "p")
    assert e.value.code == "image_url_not_allowed" and "data URL" in e.value.message


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://a.example.com/x.png", True),
        ("https://deep.a.example.com/x.png", True),
        ("https://example.com/x.png", False),  # "*.example.com" is its subdomains only
        ("https://evil-example.com/x.png", False),
        ("https://cdn.test/x.png", True),
        ("ftp://cdn.test/x.png", False),
        ("file:///etc/passwd", False),
    ],
)
def test_the_allow_list(url: str, allowed: bool) -> None:
    settings = ImageFetchSettings(enabled=True, allow_hosts=("*.example.com", "CDN.test"))
    if allowed:
        assert check_url(url, settings, "p")
    else:
        with pytest.raises(InvalidRequest) as e:
            check_url(url, settings, "p")
        assert e.value.code == "image_url_not_allowed"


@pytest.mark.parametrize(
    ("address", "ok"),
    [
        ("93.184.216.34", True),
        ("2606:4700::1111", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("192.168.0.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("::1", False),
        ("fe80::1%eth0", False),
        ("::ffff:10.0.0.1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
    ],
)
def test_which_addresses_are_public(address: str, ok: bool) -> None:
    assert public(address) is ok


async def test_an_allowed_private_host_is_fetched(port: int) -> None:
    assert await fetch(f"http://localhost:{port}/img", on(), 1 << 20, "p") == IMAGE


async def test_a_private_address_is_refused_unless_its_host_is_named(port: int) -> None:
    settings = on(private_hosts=())
    with pytest.raises(InvalidRequest) as e:
        await fetch(f"http://localhost:{port}/img", settings, 1 << 20, "p")
    assert e.value.code == "image_fetch_failed" and "may not fetch from" in e.value.message
    # A redirect from a named host to a private address it does not name is refused too.
    settings = on(allow_hosts=("localhost", "127.0.0.1"))
    with pytest.raises(InvalidRequest) as e:
        await fetch(f"http://localhost:{port}/to-ip", settings, 1 << 20, "p")
    assert e.value.code == "image_fetch_failed"
    # And a redirect to a host off the allow-list, before any connection to it.
    with pytest.raises(InvalidRequest) as e:
        await fetch(f"http://localhost:{port}/to-ip", on(), 1 << 20, "p")
    assert e.value.code == "image_url_not_allowed" and "'127.0.0.1'" in e.value.message


async def test_limits_on_a_fetch(port: int) -> None:
    with pytest.raises(RequestTooLarge) as big:
        await fetch(f"http://localhost:{port}/big", on(), 4096, "p")
    assert big.value.code == "image_too_large_bytes"
    with pytest.raises(RequestTooLarge):
        await fetch(f"http://localhost:{port}/big", on(max_bytes=100), 1 << 20, "p")
    with pytest.raises(InvalidRequest) as loop:
        await fetch(f"http://localhost:{port}/loop", on(max_redirects=2), 1 << 20, "p")
    assert "more than 2 times" in loop.value.message
    with pytest.raises(InvalidRequest) as missing:
        await fetch(f"http://localhost:{port}/nothing", on(), 1 << 20, "p")
    assert "HTTP 404" in missing.value.message
    with pytest.raises(InvalidRequest) as slow:  # the server holds the answer until teardown
        await fetch(f"http://localhost:{port}/stall", on(timeout_s=0.2), 1 << 20, "p")
    assert slow.value.code == "image_fetch_failed" and "longer than 0.2 s" in slow.value.message
