"""The one `free_port`, for the tests and the benchmark scripts (which put the repository root on
sys.path to import it). Standard library only: frontend_check.py runs it from another venv."""

from __future__ import annotations

import socket

_handed_out: set[int] = set()


def free_port() -> int:
    """A free loopback port, never one this process handed out before: a server binds its port
    seconds after its config is written, and until then the kernel may offer the same port again
    (two fleet servers once got one port, and each test saw the other's gateway)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
