"""engine_adapter/vllm_fields.py: one builder of vLLM's sampling and structured-output fields,
which vLLM's own SamplingParams takes as they are, for both vLLM engines."""

from __future__ import annotations

import json

from engine_adapter.base import EngineRequest, SamplingOptions, StructuredOutput
from engine_adapter.vllm_fields import sampling_fields, structured_fields
from engine_adapter.vllm_server import completion_body


def test_vllms_sampling_params_take_the_fields_as_they_are() -> None:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    s = SamplingOptions(max_tokens=8, n=2, temperature=0.7, top_k=-1, stop=("END",), seed=3)
    p = SamplingParams(**sampling_fields(s))
    assert (p.n, p.top_k, p.stop, p.stop_token_ids, p.seed) == (2, 0, ["END"], [], 3)
    assert sampling_fields(SamplingOptions(max_tokens=8))["stop"] == []  # what vLLM makes of None
    assert sampling_fields(SamplingOptions(max_tokens=8, n=3, temperature=0.0))["n"] == 1  # greedy: one, copied
    so = StructuredOutput(regex="[a-z]+", disable_any_whitespace=True)
    params = StructuredOutputsParams(**structured_fields(so))
    assert params.regex == "[a-z]+" and params.disable_any_whitespace


def test_both_engines_send_the_same_fields() -> None:
    """The vLLM server's body is the same builder's fields: top_k 0 (not -1), stop [] (not None)."""
    so = StructuredOutput(choice=("yes", "no"), whitespace_pattern=r"[ ]?")
    s = SamplingOptions(max_tokens=4, structured=so, logit_bias={7: 1.5})
    body = completion_body(EngineRequest(request_id="r", prompt_token_ids=(1, 2), sampling=s), "m")
    assert {k: body[k] for k in sampling_fields(s)} == sampling_fields(s)
    assert body["top_k"] == 0 and body["stop"] == [] and body["logit_bias"] == {"7": 1.5}
    assert body["structured_outputs"] == {"choice": ["yes", "no"], "whitespace_pattern": "[ ]?"}
    json.dumps(body)  # it goes over the wire as it is
