"""gateway/text/templates.py: the history prefix is probed from the template, not assumed; the
output formats are the configured ones or those the template shows."""

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from gateway.text.templates import OutputFormats, history_prefix, output_formats

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


class _Template:
    """A tokenizer as output_formats reads it: its chat template, and `</think>` as one token."""

    def __init__(self, chat_template: object) -> None:
        self.chat_template = chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [7] if text == "</think>" else [1, 2]


@pytest.mark.parametrize(
    ("template", "tool", "reasoning"),
    [
        ("{{ '<tool_call>' }}<function={{ name }}><parameter=x><think>", "qwen3_xml", "qwen3"),  # XML first
        ("<tool_call>{{ tool_call | tojson }}</tool_call>", "hermes", None),
        ("<|im_start|>{{ content }}<think>", None, "qwen3"),
        ("<|im_start|>{{ content }}", None, None),
        ([{"name": "tool_use", "template": "<tool_call>"}], "hermes", None),  # named templates: their JSON
        (None, None, None),
    ],
)
def test_auto_reads_the_formats_off_the_template(template: object, tool: str | None, reasoning: str | None) -> None:
    formats = output_formats(_Template(template), "auto", "auto")
    assert (formats.tool_format, formats.reasoning_format) == (tool, reasoning)
    assert formats.reasoning == (reasoning is not None)
    assert formats.think_end_id == (7 if reasoning else None)


def test_the_config_names_the_formats_or_none() -> None:
    xml = "<tool_call><function=f><think>"
    assert output_formats(_Template(xml), "hermes", "none") == OutputFormats(tool_format="hermes")
    assert output_formats(_Template(""), "qwen3_xml", "qwen3") == OutputFormats("qwen3_xml", "qwen3", 7)
    assert output_formats(_Template(xml), "none", "auto") == OutputFormats(None, "qwen3", 7)
    with pytest.raises(ValueError, match="unknown tool-call format 'xml'"):
        output_formats(_Template(xml), "xml", "auto")


def test_the_tiny_model_writes_hermes_calls_and_thinks(tok: Any) -> None:
    formats = output_formats(tok, "auto", "auto")
    assert (formats.tool_format, formats.reasoning_format) == ("hermes", "qwen3")
    assert formats.think_end_id == tok.encode("</think>", add_special_tokens=False)[0]


@pytest.mark.parametrize(
    ("prompt", "start"),
    [
        ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n", "open"),  # Qwen3.5 and later
        ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", "none"),  # thinking off
        ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "maybe"),  # Qwen3: the model's choice
        # Only the last assistant header on counts: past turns' think blocks do not.
        ("<|im_start|>assistant\n<think>\nx\n</think>\n\nok<|im_end|>\n<|im_start|>assistant\n", "maybe"),
        ("no chat markup <think>", "open"),
    ],
)
def test_where_the_output_starts(prompt: str, start: str) -> None:
    assert OutputFormats(reasoning_format="qwen3").reasoning_start(prompt) == start
    assert OutputFormats().reasoning_start(prompt) == "none"  # a model that does not think
