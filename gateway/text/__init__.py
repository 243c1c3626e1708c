"""Text: the fast tokenizer mirror (tiktoken where it gives the model tokenizer's ids) and
chat-template probes."""
