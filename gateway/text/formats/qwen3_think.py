"""Qwen3's think block (Qwen3, Qwen3-Coder, Qwen3.5 and later): `<think>...</think>` before the answer."""

from __future__ import annotations

from gateway.text.formats.base import ReasoningFormat, ReasoningStart

_ASSISTANT = "<|im_start|>assistant"  # ChatML's header of an assistant turn


class Qwen3Think(ReasoningFormat):
    name = "qwen3"

    def detect(self, template: str) -> bool:
        return self.think_start in template

    def reasoning_start(self, prompt_text: str) -> ReasoningStart:
        """Read from the prompt's last assistant header on: Qwen3.5 and later open the block
        in the prompt, a thinking-off prompt closes an empty one, Qwen3's leave it to the model."""
        tail = prompt_text[prompt_text.rfind(_ASSISTANT) :] if "<|im_start|>" in prompt_text else prompt_text
        opened, closed = tail.rfind(self.think_start), tail.rfind(self.think_end)
        if closed != -1 and closed > opened:
            return "none"
        if opened != -1:
            return "open"
        return "maybe"
