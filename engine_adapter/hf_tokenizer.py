"""Local Hugging Face tokenizers: loaded once per process, compared by fingerprint."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str) -> Any:
    """Load a local tokenizer once per process: it takes seconds, and engines only read it.

    The class named in tokenizer_config.json is the one AutoTokenizer would pick; taken
    directly it loads without AutoTokenizer's model-config path, which imports torch
    (seconds per process on 2 cores, for a tokenizer that needs none of it)."""
    cls = _named_class(Path(path))
    if cls is not None:
        return cls.from_pretrained(path, local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _named_class(path: Path) -> Any:
    """The tokenizer class tokenizer_config.json names, if transformers has it; else None."""
    import transformers

    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    named = config.get("tokenizer_class") if isinstance(config, dict) else None
    if not isinstance(named, str) or not named.isidentifier():
        return None
    cls = getattr(transformers, named, None)
    return cls if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedTokenizerBase) else None


def fingerprint(tokenizer: Any) -> str:
    """What makes two tokenizers count alike: the vocabulary, the special tokens and the
    chat template. A gateway checks it against a remote engine's before it serves, since
    it sends token ids the remote model must read the same way."""
    h = hashlib.sha256()
    h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps(sorted(map(str, tokenizer.all_special_tokens))).encode())
    h.update(str(getattr(tokenizer, "chat_template", "") or "").encode())
    return h.hexdigest()[:16]
