"""benchmarks/vllm_parity.py's pure comparison functions, on answers shaped as vLLM 0.32's
OpenAI server sends them (no server here)."""

from __future__ import annotations

from typing import Any

from benchmarks import vllm_parity as p


def chunk(choices: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": choices, **top}


def delta(index: int, content: str | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    d = {} if content is None else {"content": content}
    return {"index": index, "delta": d, "finish_reason": finish, **extra}


def error(status: int, param: str | None, message: str = "bad", type_: str = "BadRequestError") -> p.Answer:
    return p.Answer(status, {"error": {"message": message, "type": type_, "param": param, "code": status}})


def chat_body(content: str, finish: str = "stop", **top: Any) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
    return {"object": "chat.completion", "choices": [choice], **top}


def test_stream_choices_are_merged_per_index() -> None:
    a = p.Answer(
        200,
        chunks=[
            chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]),
            chunk([{"index": 1, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]),
            chunk([delta(0, "a", token_ids=[5])]),
            chunk([delta(1, "b", token_ids=[6])]),
            chunk([delta(0, "c", "length", token_ids=[7])]),
            chunk([delta(1, "d", "length", token_ids=[8])]),
        ],
        done=True,
    )
    cs = p.choices_of(a)
    assert [(c["index"], c["text"], c["finish_reason"], c["token_ids"]) for c in cs] == [
        (0, "ac", "length", [5, 7]),
        (1, "bd", "length", [6, 8]),
    ]
    shape = p.n_stream_shape(2)(a)
    assert shape["one_choice_per_chunk"] and shape["finished_once_each"]
    # Two choices in one chunk, or a choice finished twice, is not OpenAI's shape.
    a.chunks.append(chunk([delta(0, finish="length"), delta(1, finish="length")]))
    shape = p.n_stream_shape(2)(a)
    assert not shape["one_choice_per_chunk"] and not shape["finished_once_each"]


def test_streamed_tool_call_deltas_join_into_one_call() -> None:
    a = p.Answer(
        200,
        chunks=[
            chunk(
                [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "set_color"}}]}}]
            ),
            chunk([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"color": '}}]}}]),
            chunk([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"red"}'}}]}}]),
            chunk([delta(0, finish="tool_calls")]),
        ],
        done=True,
    )
    shape = p.tool_calls_shape(p.TOOL_SCHEMA, "set_color")(a)
    assert shape == {
        "status": 200,
        "finish": ["tool_calls"],
        "calls": 1,
        "names_ok": True,
        "ids": True,
        "arguments_valid": True,
    }
    # Arguments that parse but break the schema ($ref to an enum) are not valid.
    a.chunks[2] = chunk([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"blue"}'}}]}}])
    assert p.tool_calls_shape(p.TOOL_SCHEMA, "set_color")(a)["arguments_valid"] is False


def test_a_cut_forced_call_is_sound_when_no_call_or_parseable_arguments() -> None:
    no_call = p.Answer(200, chat_body("<to", "length"))
    assert p.cut_call_shape(no_call)["sound"] is True
    body = chat_body("", "length")
    body["choices"][0]["message"]["tool_calls"] = [
        {"id": "c", "type": "function", "function": {"name": "set_color", "arguments": '{"col'}}
    ]
    shape = p.cut_call_shape(p.Answer(200, body))
    assert shape["calls"] == 1 and shape["arguments_parse"] == [False] and shape["sound"] is False


def test_constraints() -> None:
    assert p.constrained(p.one_of(["yes", "no"]))(p.Answer(200, chat_body("no")))["honoured"] is True
    assert p.constrained(p.one_of(["yes", "no"]))(p.Answer(200, chat_body("nope", "length")))["honoured"] is False
    assert p.full_match(p.REGEX)("abc-12", "stop") and not p.full_match(p.REGEX)("abc-123", "stop")
    assert p.valid_json(p.SCHEMA)('{"color":"red","size":2}', "stop")
    assert not p.valid_json(p.SCHEMA)('{"color":"red"}', "stop")
    # json_object: an object, or one the token budget cut.
    assert p.valid_json(None)("{}", "stop") and p.valid_json(None)('{"a', "length")
    assert not p.valid_json(None)("[]", "stop") and not p.valid_json(None)('{"a', "stop")
    # An error answer is described by its error, not as an unconstrained output.
    assert p.constrained(p.one_of(["x"]))(error(400, None)) == {"status": 400, "param": None, "type": "BadRequestError"}


def test_token_ids_where_vllm_puts_them() -> None:
    prompt = [151644, 872, 198]
    chat_stream = p.Answer(
        200,
        chunks=[
            chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}], prompt_token_ids=prompt),
            chunk([delta(0, "x", token_ids=[1])]),
            chunk([delta(0, "y", "length", token_ids=[2])]),
            chunk([], usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}),
        ],
        done=True,
    )
    shape = p.token_ids_shape(chat_stream)
    assert shape["prompt_ids_at"] == "chunk" and shape["prompt_ids"] == p.ids_digest(prompt)
    assert shape["prompt_ids_match_usage"] and shape["token_ids_match_usage"]
    completion = p.Answer(
        200,
        {
            "choices": [
                {"index": 0, "text": "xy", "finish_reason": "length", "token_ids": [1], "prompt_token_ids": prompt}
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        },
    )
    shape = p.token_ids_shape(completion)
    assert shape["prompt_ids_at"] == "choice" and not shape["token_ids_match_usage"]  # 1 id for 2 tokens
    assert p.ids_digest(prompt) != p.ids_digest(prompt[::-1]) and p.ids_digest(None) is None


def test_continuous_usage_needs_usage_on_every_chunk() -> None:
    def u(n: int) -> dict[str, int]:
        return {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}

    chunks = [chunk([delta(0, "a")], usage=u(1)), chunk([delta(0, "b", "length")], usage=u(2)), chunk([], usage=u(2))]
    shape = p.continuous_usage_shape(p.Answer(200, chunks=chunks, done=True))
    assert shape == {
        "status": 200,
        "usage_on_every_chunk": True,
        "completion_tokens_rise": True,
        "last_chunk_usage_only": True,
        "done": True,
    }
    del chunks[0]["usage"]
    assert p.continuous_usage_shape(p.Answer(200, chunks=chunks, done=True))["usage_on_every_chunk"] is False


def test_prompt_logprobs_entries() -> None:
    entry = {"872": {"logprob": -15.2, "rank": 49222, "decoded_token": "user"}}
    body = chat_body("x", "length", prompt_logprobs=[None, entry, entry], usage={"prompt_tokens": 3})
    shape = p.prompt_logprobs_shape(0)(p.Answer(200, body))
    assert shape["where"] == "body" and shape["one_per_prompt_token"] and shape["first_null"]
    assert shape["value_keys"] == ["decoded_token", "logprob", "rank"] and shape["sizes_within_1_to_k+1"]
    two = {**entry, "148591": {"logprob": -2.7, "rank": 1, "decoded_token": "x"}}
    body["prompt_logprobs"] = [None, two, entry]
    assert p.prompt_logprobs_shape(0)(p.Answer(200, body))["sizes_within_1_to_k+1"] is False
    assert p.prompt_logprobs_shape(0)(p.Answer(200, chat_body("x")))["where"] is None


def test_alike_ignores_type_and_an_unnamed_or_coarser_param() -> None:
    sg = p.error_shape(error(400, "stop_token_ids[0]", type_="invalid_request_error"))
    assert p.alike(sg, p.error_shape(error(400, "stop_token_ids")))
    assert p.alike(sg, p.error_shape(error(400, None)))
    assert not p.alike(sg, p.error_shape(error(400, "logit_bias")))
    assert not p.alike(p.error_shape(error(400, "stop")), p.error_shape(error(400, "stop_token_ids")))
    assert not p.alike({"status": 200}, p.error_shape(error(400, None)))
    assert p.alike({"status": 200, "note": "a"}, {"status": 200, "note": "b"})


def test_verdicts_and_refusals() -> None:
    case = p.Case("vllm_xargs", (p.Req("chat", p.CHAT, {}, p.basic),), refusable=("vllm_xargs",))
    vllm = [p.Answer(200, chat_body("x", "length"))]
    refused = [error(400, "vllm_xargs", "vllm_xargs is not supported", "invalid_request_error")]
    assert p.verdict(case, refused, vllm) == "refused-documented"
    # A 400 that names another field is a difference, and so is any 400 where the case has no
    # refusable field.
    assert p.verdict(case, [error(400, "messages")], vllm) == "no"
    assert p.verdict(p.Case("x", case.requests), refused, vllm) == "no"
    assert p.verdict(case, [p.Answer(200, chat_body("y", "length"))], vllm) == "yes"
    assert p.summary(["yes", "no", "refused-documented", "answered-documented", "yes"]) == (
        "alike: 2 of 5 (refused by design: 1; answered where vLLM refuses: 1)"
    )


def test_answered_by_design_is_only_a_200_where_vllm_refuses() -> None:
    greedy = p.Case("n2", (p.Req("chat", p.CHAT, {}, p.basic),), answered_by_design=True)
    refusal = [error(400, None)]
    assert p.verdict(greedy, [p.Answer(200, chat_body("x", "length"))], refusal) == "answered-documented"
    assert p.verdict(greedy, [error(400, "n")], [p.Answer(200, chat_body("x", "length"))]) == "no"


def test_sparkgate_failures_are_5xx_or_no_answer() -> None:
    answers = {"a": [p.Answer(200), p.Answer(400)], "b": [p.Answer(503), p.Answer(0, error="ConnectError: refused")]}
    assert p.sparkgate_failed(answers) == ["b#0: 503", "b#1: ConnectError: refused"]


def test_trim_and_cell() -> None:
    assert p.trim(list(range(10)), max_list=6) == [0, 1, 2, "... 5 more ...", 8, 9]
    assert p.trim("x" * 500, max_str=10) == "x" * 10 + "... (500 chars)"
    case = p.Case("c", (p.Req("one", p.CHAT, {}, p.status_only), p.Req("two", p.CHAT, {}, p.error_shape)))
    text = p.cell(case, [p.Answer(200, chat_body("x")), error(400, "a|b")])
    assert text == "**one**: status=200<br>**two**: status=400 param=a\\|b type=BadRequestError"


def test_every_case_is_named_once_and_sends_json() -> None:
    import json

    names = [c.name for c in p.cases()]
    assert len(names) == len(set(names))
    for c in p.cases():
        for r in c.requests:
            assert r.path.startswith("/") and (r.body is None or json.loads(json.dumps(r.body)) == r.body)
