"""Local Hugging Face tokenizers: loaded once per process, compared by fingerprint."""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str) -> Any:
    """Load a local tokenizer once per process: it takes seconds, and engines only read it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def fingerprint(tokenizer: Any) -> str:
    """What makes two tokenizers count alike: the vocabulary, the special tokens and the
    chat template. A gateway checks it against a remote engine's before it serves, since
    it sends token ids the remote model must read the same way."""
    h = hashlib.sha256()
    h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps(sorted(map(str, tokenizer.all_special_tokens))).encode())
    h.update(str(getattr(tokenizer, "chat_template", "") or "").encode())
    return h.hexdigest()[:16]
