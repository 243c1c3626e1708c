"""`python -m tests.exit_with_parent PARENT_PID MODULE [ARG...]`: run MODULE as `python -m MODULE
ARG...` would, in this process, and SIGKILL this process's group as soon as PARENT_PID is no longer
its parent. Every server the tests start runs through it: each `sparkgate serve` and
`sparkgate engine-host` (tests/conftest.py's fleet and `launch`) and vLLM's own OpenAI server
(tests/api/test_vllm_server_engine.py).

Why: a test run that is killed (a timeout, Ctrl-C, SIGKILL) runs no teardown, and the fleet's
servers, each in its own process group, served on for minutes after it. vLLM's engine core does not
watch the server, so it must go too: the server is its group's leader, and the engine core and its
workers are in that group. SIGKILL to the whole group: a SIGTERM to the server drains (or, while
its engines start, kills them), to an engine process it is vLLM's own shutdown, and nobody is left
to wait for either. A thread polling getppid() rather than PR_SET_PDEATHSIG: that signal fires when
the *thread* that started the process ends (not its process), and it would end the server alone,
leaving its engines behind. Production servers never run this: only the tests ask for it.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys
import threading
from collections.abc import Callable

POLL_S = 0.2  # how long a server may outlive its parent, at most (plus a thread switch)


def _end_group() -> None:
    """SIGKILL this process and everything in its group, if it leads the group (the fleet starts
    it with process_group=0): never the group of whoever started it."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def watch(parent: int) -> None:
    """End this process's group once `parent` is no longer its parent: when a parent dies its
    children are re-parented (to init or a subreaper), so getppid() changes."""

    def poll() -> None:
        stop = threading.Event()  # never set: a sleep that a signal cannot cut short
        while os.getppid() == parent:
            stop.wait(POLL_S)
        _end_group()

    if os.getppid() != parent:  # it died before this process got here
        _end_group()
    threading.Thread(target=poll, name="exit-with-parent", daemon=True).start()


def command(module: str, *args: str) -> list[str]:
    """The argv that runs `python -m module *args` as a child of this process, ending with it."""
    return [sys.executable, "-m", "tests.exit_with_parent", str(os.getpid()), module, *args]


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def pdeathsig() -> Callable[[], None]:
    """A `preexec_fn` for a child that is not Python (redis-server): the kernel SIGKILLs it when
    the thread that starts it ends (PR_SET_PDEATHSIG), so start it from the main thread. Fine for
    a process that leaves no children behind."""
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork: the child only calls it
    parent = os.getpid()

    def set_signal() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # gone before the signal was set
            os.kill(os.getpid(), signal.SIGKILL)

    return set_signal


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: python -m tests.exit_with_parent PARENT_PID MODULE [ARG...]")
    watch(int(argv[0]))
    sys.argv = [argv[1], *argv[2:]]
    # As `python -m MODULE`: run as __main__ (a spawned multiprocessing child imports it again).
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
