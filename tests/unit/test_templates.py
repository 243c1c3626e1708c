"""gateway/text/templates.py: the history prefix is probed from the template, not assumed."""

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from gateway.text.templates import history_prefix

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture(scope="module")
def tok() -> Any:
    return AutoTokenizer.from_pretrained(str(MODELS / "tiny-qwen3"))


def test_thinking_off_puts_the_empty_think_block_back(tok: Any) -> None:
    assert history_prefix(tok, {"enable_thinking": False}) == "<think>\n\n</think>\n\n"


def test_templates_that_agree_need_nothing(tok: Any) -> None:
    assert history_prefix(tok, None) == ""
    assert history_prefix(tok, {"enable_thinking": True}) == ""


def test_a_template_that_strips_it_gets_nothing(tok: Any) -> None:
    class Stripping:
        """Like Qwen3's own template: drops think blocks from past answers."""

        def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool, **kw: Any) -> str:
            out = ""
            for m in messages:
                content = m["content"].split("</think>\n\n")[-1]
                out += f"<|im_start|>{m['role']}\n{content}<|im_end|>\n"
            return out + ("<|im_start|>assistant\n<think>\n\n</think>\n\n" if add_generation_prompt else "")

    assert history_prefix(Stripping(), {}) == ""  # type: ignore[arg-type]
    assert history_prefix(tok, {"other": object()}) == ""  # kwargs it cannot key on: nothing probed
