"""A request's sampling options as vLLM's fields, for both vLLM engines: `SamplingParams`'
keyword arguments in this process (vllm_local.py), the body of a vLLM server's
/v1/completions (vllm_server.py). One builder, so the two cannot drift: top_k 0 disables it
(vLLM's own default; it takes -1 too), an empty stop list is [] (vLLM makes None that).
Nothing here imports vllm."""

from __future__ import annotations

from typing import Any

from engine_adapter.base import SamplingOptions, StructuredOutput, greedy


def sampling_fields(s: SamplingOptions) -> dict[str, Any]:
    """The fields both take alike (not prompt logprobs or logit_bias, whose forms differ)."""
    return {
        "n": 1 if greedy(s) else s.n,  # n greedy choices are one, copied by the engine adapter
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": max(s.top_k, 0),
        "min_p": s.min_p,
        "seed": s.seed,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "repetition_penalty": s.repetition_penalty,
        "stop": list(s.stop),
        "stop_token_ids": list(s.stop_token_ids),
        "include_stop_str_in_output": s.include_stop_str_in_output,
        "ignore_eos": s.ignore_eos,
        "min_tokens": s.min_tokens,
        "skip_special_tokens": s.skip_special_tokens,
        "logprobs": s.logprobs,
    }


def structured_fields(so: StructuredOutput) -> dict[str, Any]:
    """vLLM's StructuredOutputsParams: the one constraint, and the options that are set."""
    out: dict[str, Any] = {}
    if so.json_object:
        out["json_object"] = True
    elif so.json_schema is not None:
        out["json"] = so.json_schema
    elif so.regex is not None:
        out["regex"] = so.regex
    elif so.choice is not None:
        out["choice"] = list(so.choice)
    elif so.grammar is not None:
        out["grammar"] = so.grammar
    elif so.structural_tag is not None:
        out["structural_tag"] = so.structural_tag
    if so.disable_any_whitespace:
        out["disable_any_whitespace"] = True
    if so.disable_additional_properties:
        out["disable_additional_properties"] = True
    if so.whitespace_pattern is not None:
        out["whitespace_pattern"] = so.whitespace_pattern
    return out
