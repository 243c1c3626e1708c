"""Keep every cache vLLM, torch and Hugging Face write inside one directory,
and never reach for a hub: set before vllm is imported."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

# vLLM names an engine's IPC sockets <VLLM_RPC_BASE_PATH>/<uuid4>, and a Unix socket's path
# holds at most 107 bytes: a cache in a deep directory would fail every engine's start.
_SUN_PATH_MAX = 107
_IPC_NAME_LEN = 1 + 36


def configure(cache_dir: str | Path) -> None:
    root = Path(cache_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    defaults = {
        "VLLM_CACHE_ROOT": root / "vllm",
        "VLLM_RPC_BASE_PATH": root / "rpc",
        "TORCHINDUCTOR_CACHE_DIR": root / "inductor",
        "TRITON_CACHE_DIR": root / "triton",
        "TIKTOKEN_CACHE_DIR": root / "tiktoken",
        "HF_HOME": root / "hf",
        "XDG_CACHE_HOME": root / "xdg",
    }
    for key, default in defaults.items():
        # A directory given in the environment must exist too (vLLM's IPC path does not create it).
        path = Path(os.environ.get(key) or default)
        mode = 0o777  # (less the umask)
        if key == "VLLM_RPC_BASE_PATH" and len(str(path)) + _IPC_NAME_LEN > _SUN_PATH_MAX:
            short = Path(tempfile.gettempdir()) / f"sparkgate-rpc-{os.getuid()}"
            log.warning("IPC directory %s is too long for a socket path; using %s", path, short)
            path, mode = short, 0o700  # in the shared temp dir: this user's only
        path.mkdir(mode=mode, parents=True, exist_ok=True)
        os.environ[key] = str(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
