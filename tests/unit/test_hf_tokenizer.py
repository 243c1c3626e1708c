"""engine_adapter/hf_tokenizer.py: the tokenizer the simulated, replay and remote engines load
is the one AutoTokenizer gives (and the one vLLM loads), without importing torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engine_adapter.hf_tokenizer import _named_class, fingerprint, load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "tiny-qwen3"


def test_the_named_class_is_what_autotokenizer_gives() -> None:
    from transformers import AutoTokenizer

    ours = load_tokenizer.__wrapped__(str(MODEL))
    auto = AutoTokenizer.from_pretrained(str(MODEL), local_files_only=True)
    assert type(ours) is type(auto)
    assert ours.backend_tokenizer.to_str() == auto.backend_tokenizer.to_str()
    assert ours.chat_template == auto.chat_template
    assert ours.all_special_tokens == auto.all_special_tokens and ours.eos_token_id == auto.eos_token_id
    assert fingerprint(ours) == fingerprint(auto)
    text = "Hello <|im_start|>user\nnaïve 東京<|im_end|>"
    assert ours.encode(text) == auto.encode(text)


def test_loading_imports_no_torch() -> None:
    code = (
        "import sys; from engine_adapter.hf_tokenizer import load_tokenizer; "
        f"load_tokenizer({str(MODEL)!r}); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_only_a_tokenizer_class_transformers_has_is_taken(tmp_path: Path) -> None:
    assert _named_class(MODEL).__name__ == "Qwen2Tokenizer"
    assert _named_class(tmp_path) is None  # no tokenizer_config.json
    config = tmp_path / "tokenizer_config.json"
    for written in ("[1, 2]", "{", json.dumps({"tokenizer_class": 7})):
        config.write_text(written)
        assert _named_class(tmp_path) is None
    for name in ("os.system", "NoSuchTokenizer", "AutoConfig", "AutoTokenizer"):  # not a name, unknown, not a tokenizer
        config.write_text(json.dumps({"tokenizer_class": name}))
        assert _named_class(tmp_path) is None, name


def test_an_unknown_class_goes_to_autotokenizer(tmp_path: Path) -> None:
    for f in MODEL.iterdir():
        if f.name.startswith("tokenizer") or f.name == "config.json":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "NoSuchTokenizer"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    loaded = load_tokenizer.__wrapped__(str(tmp_path))
    assert fingerprint(loaded) == fingerprint(load_tokenizer(str(MODEL)))
