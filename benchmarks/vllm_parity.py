"""sparkgate vs vLLM's own OpenAI server: the same requests, answered alike? (issue 43, item 3)

Run from the repository root (the models must exist: `make models`):

    .venv/bin/python benchmarks/vllm_parity.py [--only CASE ...] [--json out.json]
    # against servers already running (each on models/tiny-qwen3, key sk-sparkgate-dev):
    .venv/bin/python benchmarks/vllm_parity.py --sparkgate-url http://127.0.0.1:8000 --vllm-url http://127.0.0.1:8001
    # sparkgate as of a commit (git archive), e.g. before and after a change:
    .venv/bin/python benchmarks/vllm_parity.py --sparkgate-ref HEAD~3

Starts `sparkgate serve` on config/default.yaml's first model (sparkgate-tiny: the tiny
random-weight Qwen3, its max_model_len, max_num_seqs, KV bytes, prefix caching and eager mode;
the demo key sk-sparkgate-dev), sends every case's requests, stops it; then starts vLLM 0.32's
`python -m vllm.entrypoints.openai.api_server` on the same model and settings (the CPU build in
.venv, `--api-key`, `--enable-auto-tool-choice --tool-call-parser hermes`, and the two engine
settings sparkgate's in-process engine sets itself: seed 0 and xgrammar JSON without free
whitespace) and sends the same requests. The two engines never share the 2 cores.

The weights are random, so the text is never compared: each request's answer is reduced to
its shape and semantics (status; the error's `param`; which fields are there; counts: choices,
one choice per SSE chunk, each choice's finish_reason, usage on every chunk when asked, token id
lists as long as the usage says; the prompt's token ids, equal on both since both render the
same chat template with the same tokenizer; the constraint honoured: the output is one of the
choices, matches the regex, parses and validates against the schema, ...) by a small pure
function per request, and a case is alike when every request's shape is. An error's `type` is
shown, never compared (vLLM says "BadRequestError", OpenAI and sparkgate
"invalid_request_error"); its `param` is compared unless vLLM leaves it null or sparkgate names
the same field more precisely (`stop_token_ids[0]` for vLLM's `stop_token_ids`).

Fields sparkgate refuses by design (a 400 naming the field, where vLLM honours it) are
"refused-documented", not "no"; n greedy choices, which vLLM refuses and sparkgate answers
(one choice, copied), are "answered-documented". Markdown to stdout: case | sparkgate | vLLM | alike?, then
"alike: X of Y (refused by design: Z)"; progress to stderr. --json writes every case's
requests, shapes and both servers' answers (trimmed). Exits non-zero when sparkgate answered
a request with a 5xx or not at all.
"""

from __future__ import annotations

import os
import sys

# Run as a script, Python puts benchmarks/ first on sys.path: the standard library first, then the repository root.
sys.path.insert(0, os.path.dirname(os.__file__))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import contextlib
import functools
import hashlib
import json
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-sparkgate-dev"  # config/default.yaml's demo key; vLLM's server gets it as --api-key
MODEL = "sparkgate-tiny"  # config/default.yaml's first model, served under this name by both
VOCAB = 151936  # models/tiny-qwen3/config.json's vocab_size
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
STARTUP_TIMEOUT_S = 600
SEED = 7
MESSAGES = [{"role": "user", "content": "Say hi."}]
PROMPT = "Say hi."
ASSISTANT_PREFIX = "Hello there"
WITH_PREFIX = [*MESSAGES, {"role": "assistant", "content": ASSISTANT_PREFIX}]
# Keys shown in the table but never compared.
INFO_KEYS = frozenset({"type", "note"})


def log(msg: str) -> None:
    print(f"[parity {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- answers ---------------------------------------------------------------------------------


@dataclass
class Answer:
    """One HTTP answer: status 0 when none came (connection error, timeout)."""

    status: int
    body: Any = None  # the JSON body (not streamed, or an error before the stream)
    chunks: list[Any] = field(default_factory=list)  # the stream's `data:` events, parsed
    done: bool = False  # `data: [DONE]` seen
    error: str = ""  # no answer: why

    @property
    def streamed(self) -> bool:
        return bool(self.chunks) or self.done

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        if self.streamed:
            out["chunks"] = self.chunks
            out["done"] = self.done
        else:
            out["body"] = self.body
        if self.error:
            out["error"] = self.error
        return out


def send(client: Any, base: str, path: str, body: dict[str, Any] | None) -> Answer:
    """GET (no body) or POST; a streamed request's events are read to the end."""
    import httpx

    headers = {"Authorization": f"Bearer {KEY}"}
    try:
        if body is None:
            r = client.get(base + path, headers=headers)
            return Answer(r.status_code, _json_or_text(r.text))
        if not body.get("stream"):
            r = client.post(base + path, json=body, headers=headers)
            return Answer(r.status_code, _json_or_text(r.text))
        with client.stream("POST", base + path, json=body, headers=headers) as r:
            if r.status_code != 200 or not r.headers.get("content-type", "").startswith("text/event-stream"):
                return Answer(r.status_code, _json_or_text(r.read().decode()))
            answer = Answer(r.status_code)
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    answer.done = True
                else:
                    answer.chunks.append(_json_or_text(data))
            return answer
    except httpx.HTTPError as e:
        return Answer(0, error=f"{type(e).__name__}: {e}")


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


# -- pure helpers: what an answer holds ------------------------------------------------------


def error_of(a: Answer) -> dict[str, Any]:
    """An answer's error object (OpenAI's `{"error": {...}}`), in the body or as a stream event."""
    for item in [a.body, *a.chunks]:
        if isinstance(item, dict) and isinstance(item.get("error"), dict):
            return dict(item["error"])
        if isinstance(item, dict) and isinstance(item.get("error"), str):  # vLLM's 401: {"error": "Unauthorized"}
            return {"message": item["error"]}
    return {}


def error_shape(a: Answer) -> dict[str, Any]:
    """Status and the error's param (type shown only); for a 200, just the status."""
    if a.status == 0:
        return {"status": 0, "note": a.error[:80]}
    e = error_of(a)
    if a.status == 200 and not e:
        return {"status": 200}
    out: dict[str, Any] = {"status": a.status, "param": e.get("param")}
    if e.get("type"):
        out["type"] = e["type"]
    return out


def choices_of(a: Answer) -> list[dict[str, Any]]:
    """Each choice, a stream's deltas merged: index, text (chat content or completion text),
    finish_reason, token_ids (None when no chunk had them), tool calls, logprobs tokens."""
    merged: dict[int, dict[str, Any]] = {}
    if not a.streamed:
        for c in (a.body or {}).get("choices") or []:
            msg = c.get("message") or {}
            calls = [
                {
                    "id": t.get("id"),
                    "name": (t.get("function") or {}).get("name"),
                    "arguments": t["function"].get("arguments"),
                }
                for t in msg.get("tool_calls") or []
                if t.get("function")
            ]
            merged[c.get("index", 0)] = {
                "text": msg.get("content") if "message" in c else c.get("text"),
                "finish_reason": c.get("finish_reason"),
                "finishes": 1 if c.get("finish_reason") else 0,
                "token_ids": c.get("token_ids"),
                "tool_calls": calls,
                "logprobs": c.get("logprobs"),
                "prompt_logprobs": c.get("prompt_logprobs"),
                "prompt_token_ids": c.get("prompt_token_ids"),
            }
        return [merged[i] | {"index": i} for i in sorted(merged)]
    for chunk in a.chunks:
        if not isinstance(chunk, dict):
            continue
        for c in chunk.get("choices") or []:
            m = merged.setdefault(
                c.get("index", 0),
                {"text": None, "finish_reason": None, "finishes": 0, "token_ids": None, "tool_calls": []},
            )
            piece = (c.get("delta") or {}).get("content") if "delta" in c else c.get("text")
            if piece is not None:
                m["text"] = (m["text"] or "") + piece
            if c.get("token_ids") is not None:
                m["token_ids"] = (m["token_ids"] or []) + list(c["token_ids"])
            if c.get("prompt_token_ids") is not None:
                m["prompt_token_ids"] = c["prompt_token_ids"]
            if c.get("finish_reason"):
                m["finish_reason"] = c["finish_reason"]
                m["finishes"] += 1
            lp = c.get("logprobs")
            if isinstance(lp, dict) and "tokens" in lp:  # completions: concatenate the lists
                acc = m.setdefault("logprobs", {"tokens": [], "token_logprobs": [], "top_logprobs": []})
                for k in ("tokens", "token_logprobs", "top_logprobs"):
                    acc[k] += list(lp.get(k) or [])
            for t in (c.get("delta") or {}).get("tool_calls") or []:
                i = t.get("index", 0)
                while len(m["tool_calls"]) <= i:
                    m["tool_calls"].append({"id": None, "name": None, "arguments": ""})
                call, fn = m["tool_calls"][i], t.get("function") or {}
                call["id"] = call["id"] or t.get("id")
                call["name"] = call["name"] or fn.get("name")
                call["arguments"] += fn.get("arguments") or ""
    return [merged[i] | {"index": i} for i in sorted(merged)]


def usage_of(a: Answer) -> dict[str, Any] | None:
    """The usage: the body's, or the last chunk's that has one."""
    if not a.streamed:
        u = (a.body or {}).get("usage") if isinstance(a.body, dict) else None
        return u if isinstance(u, dict) else None
    for chunk in reversed(a.chunks):
        if isinstance(chunk, dict) and isinstance(chunk.get("usage"), dict):
            return dict(chunk["usage"])
    return None


def prompt_ids_of(a: Answer) -> tuple[str, list[int] | None]:
    """Where the prompt's token ids came ("body", "choice", "chunk", "chunk.choice") and the ids."""
    if not a.streamed:
        body = a.body if isinstance(a.body, dict) else {}
        if body.get("prompt_token_ids") is not None:
            return "body", list(body["prompt_token_ids"])
        for c in body.get("choices") or []:
            if c.get("prompt_token_ids") is not None:
                return "choice", list(c["prompt_token_ids"])
        return "", None
    for chunk in a.chunks:
        if not isinstance(chunk, dict):
            continue
        if chunk.get("prompt_token_ids") is not None:
            return "chunk", list(chunk["prompt_token_ids"])
        for c in chunk.get("choices") or []:
            if c.get("prompt_token_ids") is not None:
                return "chunk.choice", list(c["prompt_token_ids"])
    return "", None


def ids_digest(ids: Sequence[int] | None) -> str | None:
    """A short name for a token id list: its length and a hash, equal for equal lists."""
    if ids is None:
        return None
    return f"{len(ids)}:{hashlib.sha1(json.dumps(list(ids)).encode()).hexdigest()[:8]}"


def ok200(a: Answer) -> dict[str, Any] | None:
    """None for a clean 200 (the caller describes it); otherwise the error's shape."""
    if a.status != 200 or error_of(a):
        return error_shape(a)
    return None


# -- pure checks: one answer -> its shape ----------------------------------------------------

Check = Callable[[Answer], dict[str, Any]]


def constrained(ok: Callable[[str, str | None], bool]) -> Check:
    """Every choice ended and honoured the constraint (`ok(text, finish_reason)`)."""

    def check(a: Answer) -> dict[str, Any]:
        if (bad := ok200(a)) is not None:
            return bad
        cs = choices_of(a)
        return {
            "status": 200,
            "finish": [c["finish_reason"] for c in cs],
            "honoured": all(ok(c["text"] or "", c["finish_reason"]) for c in cs) and bool(cs),
        }

    return check


def one_of(options: Sequence[str]) -> Callable[[str, str | None], bool]:
    return lambda text, _finish: text in options


def full_match(pattern: str) -> Callable[[str, str | None], bool]:
    compiled = re.compile(pattern)
    return lambda text, _finish: compiled.fullmatch(text) is not None


def valid_json(schema: dict[str, Any] | None) -> Callable[[str, str | None], bool]:
    """The text parses as JSON (an object when `schema` is None) and validates against `schema`;
    for json_object (no schema) a cut answer (finish `length`) that began an object also counts."""

    def ok(text: str, finish: str | None) -> bool:
        try:
            value = json.loads(text)
        except ValueError:
            return schema is None and finish == "length" and text.lstrip().startswith("{")
        if schema is None:
            return isinstance(value, dict)
        import jsonschema

        try:
            jsonschema.validate(value, schema)
        except jsonschema.ValidationError:
            return False
        return True

    return ok


def status_only(a: Answer) -> dict[str, Any]:
    return ok200(a) or {"status": 200}


def basic(a: Answer) -> dict[str, Any]:
    """A 200's choices and finish reasons."""
    if (bad := ok200(a)) is not None:
        return bad
    cs = choices_of(a)
    return {"status": 200, "choices": len(cs), "finish": [c["finish_reason"] for c in cs]}


def prompt_logprobs_shape(k: int) -> Check:
    """prompt_logprobs: where it is (top level: chat; in the choice: completions), one entry per
    prompt token, the first null, each other a dict keyed by token id (as a string) holding the
    prompt's token and up to k others, each value {logprob, rank, decoded_token}."""

    def check(a: Answer) -> dict[str, Any]:
        if (bad := ok200(a)) is not None:
            return bad
        body = a.body if isinstance(a.body, dict) else {}
        where, entries = "", None
        if body.get("prompt_logprobs") is not None:
            where, entries = "body", body["prompt_logprobs"]
        else:
            for c in body.get("choices") or []:
                if c.get("prompt_logprobs") is not None:
                    where, entries = "choice", c["prompt_logprobs"]
        if entries is None:
            return {"status": 200, "where": None}
        usage = usage_of(a) or {}
        rest = [e for e in entries[1:] if isinstance(e, dict)]
        keys = sorted({k for e in rest for v in e.values() if isinstance(v, dict) for k in v})
        return {
            "status": 200,
            "where": where,
            "one_per_prompt_token": len(entries) == usage.get("prompt_tokens"),
            "first_null": bool(entries) and entries[0] is None,
            "dicts_keyed_by_id": len(rest) == len(entries) - 1
            and all(re.fullmatch(r"\d+", t) for e in rest for t in e),
            "sizes_within_1_to_k+1": all(1 <= len(e) <= k + 1 for e in rest),
            "value_keys": keys,
        }

    return check


def echo_shape(prefix: str) -> Check:
    """Chat echo: the answer's content starts with the last (assistant) message's content; when
    streamed, a chunk carries that content alone, before the generated ones."""

    def check(a: Answer) -> dict[str, Any]:
        if (bad := ok200(a)) is not None:
            return bad
        cs = choices_of(a)
        out: dict[str, Any] = {
            "status": 200,
            "starts_with_last_message": bool(cs) and all((c["text"] or "").startswith(prefix) for c in cs),
            "prompt_tokens": (usage_of(a) or {}).get("prompt_tokens"),
        }
        if a.streamed:
            pieces = [
                (c.get("delta") or {}).get("content")
                for ch in a.chunks
                if isinstance(ch, dict)
                for c in ch.get("choices") or []
            ]
            out["echo_chunk"] = prefix in pieces
        else:
            out["prompt_logprobs"] = isinstance(a.body, dict) and a.body.get("prompt_logprobs") is not None
        return out

    return check


def prompt_tokens_shape(a: Answer) -> dict[str, Any]:
    if (bad := ok200(a)) is not None:
        return bad
    return {"status": 200, "prompt_tokens": (usage_of(a) or {}).get("prompt_tokens")}


def continuous_usage_shape(a: Answer) -> dict[str, Any]:
    """stream_options.continuous_usage_stats: usage on every chunk, completion_tokens never going
    down, a last chunk with no choices and the final usage."""
    if (bad := ok200(a)) is not None:
        return bad
    chunks = [c for c in a.chunks if isinstance(c, dict)]
    usages = [c.get("usage") for c in chunks]
    counts = [u.get("completion_tokens", -1) for u in usages if isinstance(u, dict)]
    last = chunks[-1] if chunks else {}
    return {
        "status": 200,
        "usage_on_every_chunk": bool(chunks) and all(isinstance(u, dict) for u in usages),
        "completion_tokens_rise": counts == sorted(counts),
        "last_chunk_usage_only": last.get("choices") == [] and isinstance(last.get("usage"), dict),
        "done": a.done,
    }


def token_ids_shape(a: Answer) -> dict[str, Any]:
    """return_token_ids: where the prompt's ids are, that they are as many as usage.prompt_tokens
    (the digest compares them across servers), and each choice's token_ids as many as
    usage.completion_tokens (summed over a stream's chunks)."""
    if (bad := ok200(a)) is not None:
        return bad
    where, ids = prompt_ids_of(a)
    usage = usage_of(a) or {}
    cs = choices_of(a)
    out_ids = [c["token_ids"] for c in cs]
    return {
        "status": 200,
        "prompt_ids_at": where or None,
        "prompt_ids": ids_digest(ids),
        "prompt_ids_match_usage": ids is not None and len(ids) == usage.get("prompt_tokens"),
        "token_ids_match_usage": bool(cs)
        and all(t is not None for t in out_ids)
        and sum(len(t or []) for t in out_ids) == usage.get("completion_tokens"),
    }


def truncated_ids_shape(a: Answer) -> dict[str, Any]:
    """Which prompt tokens a truncation kept (needs return_token_ids) and how many."""
    if (bad := ok200(a)) is not None:
        return bad
    return {
        "status": 200,
        "prompt_tokens": (usage_of(a) or {}).get("prompt_tokens"),
        "prompt_ids": ids_digest(prompt_ids_of(a)[1]),
    }


def n_stream_shape(n: int) -> Check:
    """n > 1 streamed: exactly one choice per chunk, every index 0..n-1 seen, each finished once."""

    def check(a: Answer) -> dict[str, Any]:
        if (bad := ok200(a)) is not None:
            return bad
        with_choices = [c for c in a.chunks if isinstance(c, dict) and c.get("choices")]
        cs = choices_of(a)
        return {
            "status": 200,
            "one_choice_per_chunk": all(len(c["choices"]) == 1 for c in with_choices),
            "indices": [c["index"] for c in cs],
            "finish": [c["finish_reason"] for c in cs],
            "finished_once_each": len(cs) == n and all(c["finishes"] == 1 for c in cs),
        }

    return check


def n_greedy_shape(a: Answer) -> dict[str, Any]:
    """n > 1 at temperature 0: a 400, or n choices (alike or not: noted)."""
    if (bad := ok200(a)) is not None:
        return bad
    cs = choices_of(a)
    return {"status": 200, "choices": len(cs), "note": f"same text: {len({c['text'] for c in cs}) == 1}"}


def tool_calls_shape(schema: dict[str, Any], name: str) -> Check:
    """A forced call: finish reason, how many calls, each named `name`, each call's arguments
    parse as JSON and validate against the tool's schema."""

    def check(a: Answer) -> dict[str, Any]:
        if (bad := ok200(a)) is not None:
            return bad
        cs = choices_of(a)
        calls = [t for c in cs for t in c["tool_calls"]]
        return {
            "status": 200,
            "finish": [c["finish_reason"] for c in cs],
            "calls": len(calls),
            "names_ok": all(t["name"] == name for t in calls),
            "ids": all(bool(t["id"]) for t in calls),
            "arguments_valid": all(valid_json(schema)(t["arguments"] or "", None) for t in calls),
        }

    return check


def cut_call_shape(a: Answer) -> dict[str, Any]:
    """A forced call cut by the token budget: either a call whose arguments parse, or finish
    `length` and no call; the content left is noted."""
    if (bad := ok200(a)) is not None:
        return bad
    cs = choices_of(a)
    calls = [t for c in cs for t in c["tool_calls"]]
    parse = []
    for t in calls:
        try:
            json.loads(t["arguments"] or "")
            parse.append(True)
        except ValueError:
            parse.append(False)
    finish = [c["finish_reason"] for c in cs]
    return {
        "status": 200,
        "finish": finish,
        "calls": len(calls),
        "arguments_parse": parse,
        "sound": all(parse) if calls else finish == ["length"],
        "note": f"content {json.dumps(cs[0]['text'])[:30] if cs else None}",
    }


def completion_logprobs_shape(a: Answer) -> dict[str, Any]:
    """Completions logprobs 0: one token per completion token, each top_logprobs entry holding the
    sampled token (and only it)."""
    if (bad := ok200(a)) is not None:
        return bad
    cs = choices_of(a)
    lp = (cs[0].get("logprobs") or {}) if cs else {}
    tokens, tops = lp.get("tokens") or [], lp.get("top_logprobs") or []
    return {
        "status": 200,
        "tokens_match_usage": len(tokens) == (usage_of(a) or {}).get("completion_tokens", -1),
        "top_has_sampled_only": len(tops) == len(tokens)
        and all(isinstance(t, dict) and list(t) == [tok] for t, tok in zip(tops, tokens, strict=False)),
    }


def echo_logprobs_shape(prompt: str) -> Check:
    """Completions echo + logprobs: the text starts with the prompt, logprobs cover prompt and
    completion tokens, the first token's logprob and top_logprobs are null."""

    def check(a: Answer) -> dict[str, Any]:
        if (bad := ok200(a)) is not None:
            return bad
        cs = choices_of(a)
        usage = usage_of(a) or {}
        lp = (cs[0].get("logprobs") or {}) if cs else {}
        tokens = lp.get("tokens") or []
        return {
            "status": 200,
            "text_starts_with_prompt": bool(cs) and (cs[0]["text"] or "").startswith(prompt),
            "tokens_cover_prompt_and_completion": len(tokens)
            == usage.get("prompt_tokens", -1) + usage.get("completion_tokens", -1),
            "first_null": bool(tokens)
            and (lp.get("token_logprobs") or [0])[0] is None
            and (lp.get("top_logprobs") or [0])[0] is None,
            "prompt_logprobs": bool(cs) and cs[0].get("prompt_logprobs") is not None,
        }

    return check


def version_shape(a: Answer) -> dict[str, Any]:
    if (bad := ok200(a)) is not None:
        return bad
    body = a.body if isinstance(a.body, dict) else {}
    return {"status": 200, "version_is_text": isinstance(body.get("version"), str), "note": "keys " + ",".join(body)}


def models_shape(a: Answer) -> dict[str, Any]:
    if (bad := ok200(a)) is not None:
        return bad
    body = a.body if isinstance(a.body, dict) else {}
    entries = {m.get("id"): m for m in body.get("data") or [] if isinstance(m, dict)}
    ours = entries.get(MODEL, {})
    return {
        "status": 200,
        "object": body.get("object"),
        "lists_model": MODEL in entries,
        "entry_object": ours.get("object"),
        "max_model_len": ours.get("max_model_len"),
        "note": "keys " + ",".join(sorted(ours)),
    }


# -- cases -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Req:
    label: str
    path: str
    body: dict[str, Any] | None  # None: GET
    check: Check


@dataclass(frozen=True)
class Case:
    name: str
    requests: tuple[Req, ...]
    refusable: tuple[str, ...] = ()  # fields sparkgate refuses by design (a 400 naming them)
    # sparkgate answers what vLLM refuses, by design (n greedy choices: one, copied)
    answered_by_design: bool = False


def chat(**fields: Any) -> dict[str, Any]:
    """A chat request: greedy, seeded, 8 tokens, `fields` over that (None: the field left out)."""
    body = {"model": MODEL, "messages": MESSAGES, "temperature": 0, "seed": SEED, "max_tokens": 8} | fields
    return {k: v for k, v in body.items() if v is not None}


def comp(**fields: Any) -> dict[str, Any]:
    """A completions request, as `chat`."""
    body = {"model": MODEL, "prompt": PROMPT, "temperature": 0, "seed": SEED, "max_tokens": 8} | fields
    return {k: v for k, v in body.items() if v is not None}


CHOICES = ["yes", "no", "maybe"]
REGEX = r"[a-c]{3}-[0-9]{2}"
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"type": "string", "enum": ["red", "green"]},
        "size": {"type": "integer", "enum": [1, 2, 3]},
    },
    "required": ["color", "size"],
    "additionalProperties": False,
}
EBNF = 'root ::= [0-9] [0-9] "-" ("ab" | "cd")'
EBNF_RE = r"[0-9]{2}-(ab|cd)"
LARK = 'start: NUM "+" NUM\nNUM: /[0-9]{1,2}/'
LARK_RE = r"[0-9]{1,2}\+[0-9]{1,2}"
TAG_FORMAT = {
    "type": "tag",
    "begin": "<a>",
    "content": {"type": "json_schema", "json_schema": {"type": "string", "enum": ["x", "y"]}},
    "end": "</a>",
}
# vLLM 0.32 takes structured_outputs.structural_tag as a JSON *string* (an object is a 400).
STRUCTURAL_TAG = json.dumps({"type": "structural_tag", "format": TAG_FORMAT})
TAG_RE = r'<a>"(x|y)"</a>'
# A pydantic-style tool: its parameters use $defs/$ref, and strict (vLLM 0.32's hermes format
# constrains the arguments to the schema only for a strict tool, else to any JSON value).
TOOL_SCHEMA = {
    "$defs": {"Color": {"type": "string", "enum": ["red", "green"]}},
    "type": "object",
    "properties": {"color": {"$ref": "#/$defs/Color"}},
    "required": ["color"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "set_color", "description": "Set a color.", "parameters": TOOL_SCHEMA, "strict": True},
    }
]
NAMED = {"type": "function", "function": {"name": "set_color"}}
LONG_PROMPT = "one two three four"


def so(**constraint: Any) -> dict[str, Any]:
    return {"structured_outputs": constraint}


def cases() -> list[Case]:
    ids_usage = {"stream_options": {"include_usage": True}}
    return [
        Case(
            "so_choice",
            (
                Req("chat", CHAT, chat(**so(choice=CHOICES)), constrained(one_of(CHOICES))),
                Req("completions", COMP, comp(**so(choice=CHOICES)), constrained(one_of(CHOICES))),
            ),
        ),
        Case(
            "so_regex",
            (
                Req("chat", CHAT, chat(max_tokens=16, **so(regex=REGEX)), constrained(full_match(REGEX))),
                Req("completions", COMP, comp(max_tokens=16, **so(regex=REGEX)), constrained(full_match(REGEX))),
            ),
        ),
        Case(
            "so_json",
            (
                Req("chat", CHAT, chat(max_tokens=32, **so(json=SCHEMA)), constrained(valid_json(SCHEMA))),
                Req("completions", COMP, comp(max_tokens=32, **so(json=SCHEMA)), constrained(valid_json(SCHEMA))),
            ),
        ),
        Case(
            "so_grammar",
            (
                Req("chat ebnf", CHAT, chat(max_tokens=16, **so(grammar=EBNF)), constrained(full_match(EBNF_RE))),
                Req("compl. lark", COMP, comp(max_tokens=16, **so(grammar=LARK)), constrained(full_match(LARK_RE))),
            ),
        ),
        Case(
            "so_structural_tag",
            (
                Req(
                    "chat",
                    CHAT,
                    chat(max_tokens=16, **so(structural_tag=STRUCTURAL_TAG)),
                    constrained(full_match(TAG_RE)),
                ),
                Req(
                    "completions",
                    COMP,
                    comp(max_tokens=16, **so(structural_tag=STRUCTURAL_TAG)),
                    constrained(full_match(TAG_RE)),
                ),
                Req(
                    "chat response_format",
                    CHAT,
                    chat(max_tokens=16, response_format={"type": "structural_tag", "format": TAG_FORMAT}),
                    constrained(full_match(TAG_RE)),
                ),
            ),
        ),
        Case(
            "so_invalid",
            (
                Req("bad regex", CHAT, chat(**so(regex="(")), error_shape),
                Req("bad schema", CHAT, chat(**so(json={"type": "nonsense"})), error_shape),
                Req("bad grammar", CHAT, chat(**so(grammar="root ::= (")), error_shape),
                Req("two at once", CHAT, chat(**so(choice=["a"], regex="a")), error_shape),
                Req(
                    "bad tag",
                    CHAT,
                    chat(**so(structural_tag='{"type": "structural_tag", "format": {"type": "nope"}}')),
                    error_shape,
                ),
                Req(
                    "tag as object",
                    CHAT,
                    chat(**so(structural_tag={"type": "structural_tag", "format": TAG_FORMAT})),
                    error_shape,
                ),
                Req("compl. bad regex", COMP, comp(**so(regex="(")), error_shape),
            ),
        ),
        Case(
            "response_format_json_schema",
            (
                Req(
                    "chat",
                    CHAT,
                    chat(
                        max_tokens=32,
                        response_format={
                            "type": "json_schema",
                            "json_schema": {"name": "c", "strict": True, "schema": SCHEMA},
                        },
                    ),
                    constrained(valid_json(SCHEMA)),
                ),
            ),
        ),
        Case(
            "response_format_json_object",
            (
                Req(
                    "chat",
                    CHAT,
                    chat(max_tokens=16, response_format={"type": "json_object"}),
                    constrained(valid_json(None)),
                ),
                Req(
                    "completions",
                    COMP,
                    comp(max_tokens=16, response_format={"type": "json_object"}),
                    constrained(valid_json(None)),
                ),
            ),
        ),
        Case(
            "prompt_logprobs",
            (
                Req("chat k=1", CHAT, chat(max_tokens=2, prompt_logprobs=1), prompt_logprobs_shape(1)),
                Req("chat k=0", CHAT, chat(max_tokens=2, prompt_logprobs=0), prompt_logprobs_shape(0)),
                Req("completions k=1", COMP, comp(max_tokens=2, prompt_logprobs=1), prompt_logprobs_shape(1)),
            ),
        ),
        Case(
            "prompt_logprobs_stream",
            (
                Req("chat", CHAT, chat(max_tokens=2, prompt_logprobs=1, stream=True), error_shape),
                Req("completions", COMP, comp(max_tokens=2, prompt_logprobs=1, stream=True), error_shape),
            ),
        ),
        Case(
            "chat_echo",
            (
                Req(
                    "last assistant",
                    CHAT,
                    chat(max_tokens=4, messages=WITH_PREFIX, echo=True),
                    echo_shape(ASSISTANT_PREFIX),
                ),
                Req(
                    "streamed",
                    CHAT,
                    chat(
                        max_tokens=4,
                        messages=WITH_PREFIX,
                        echo=True,
                        stream=True,
                        stream_options={"include_usage": True},
                    ),
                    echo_shape(ASSISTANT_PREFIX),
                ),
                Req(
                    "+continue",
                    CHAT,
                    chat(
                        max_tokens=4,
                        messages=WITH_PREFIX,
                        echo=True,
                        add_generation_prompt=False,
                        continue_final_message=True,
                    ),
                    echo_shape(ASSISTANT_PREFIX),
                ),
            ),
        ),
        Case(
            "continue_final_message",
            (
                Req(
                    "continue",
                    CHAT,
                    chat(max_tokens=4, messages=WITH_PREFIX, add_generation_prompt=False, continue_final_message=True),
                    prompt_tokens_shape,
                ),
                Req("new turn (default)", CHAT, chat(max_tokens=4, messages=WITH_PREFIX), prompt_tokens_shape),
                Req(
                    "both true",
                    CHAT,
                    chat(max_tokens=4, messages=WITH_PREFIX, add_generation_prompt=True, continue_final_message=True),
                    error_shape,
                ),
            ),
        ),
        Case(
            "continuous_usage_stats",
            tuple(
                Req(
                    label,
                    path,
                    make(
                        max_tokens=3,
                        stream=True,
                        stream_options={"include_usage": True, "continuous_usage_stats": True},
                    ),
                    continuous_usage_shape,
                )
                for label, path, make in (("chat", CHAT, chat), ("completions", COMP, comp))
            ),
        ),
        Case(
            "return_token_ids",
            (
                Req("chat", CHAT, chat(max_tokens=3, return_token_ids=True), token_ids_shape),
                Req(
                    "chat stream",
                    CHAT,
                    chat(max_tokens=3, return_token_ids=True, stream=True, **ids_usage),
                    token_ids_shape,
                ),
                Req("completions", COMP, comp(max_tokens=3, return_token_ids=True), token_ids_shape),
                Req(
                    "compl. stream",
                    COMP,
                    comp(max_tokens=3, return_token_ids=True, stream=True, **ids_usage),
                    token_ids_shape,
                ),
            ),
        ),
        Case(
            "truncate_prompt_tokens",
            (
                Req("chat k=5", CHAT, chat(max_tokens=2, truncate_prompt_tokens=5), prompt_tokens_shape),
                Req("chat k=-1", CHAT, chat(max_tokens=2, truncate_prompt_tokens=-1), prompt_tokens_shape),
                Req("chat k>max_model_len", CHAT, chat(max_tokens=2, truncate_prompt_tokens=70000), error_shape),
                Req(
                    "compl. k=2",
                    COMP,
                    comp(max_tokens=2, prompt=LONG_PROMPT, truncate_prompt_tokens=2),
                    prompt_tokens_shape,
                ),
                Req("compl. k>max_model_len", COMP, comp(max_tokens=2, truncate_prompt_tokens=70000), error_shape),
            ),
        ),
        Case(
            "truncation_side",
            tuple(
                Req(
                    f"{label} {side}",
                    path,
                    make(max_tokens=2, truncate_prompt_tokens=k, truncation_side=side, return_token_ids=True, **extra),
                    truncated_ids_shape,
                )
                for label, path, make, k, extra in (
                    ("chat", CHAT, chat, 5, {}),
                    ("compl.", COMP, comp, 2, {"prompt": LONG_PROMPT}),
                )
                for side in ("left", "right")
            ),
        ),
        Case(
            "n2_stream",
            (
                Req(
                    "chat",
                    CHAT,
                    chat(n=2, temperature=0.8, max_tokens=4, stream=True, **ids_usage),
                    n_stream_shape(2),
                ),
                Req(
                    "completions",
                    COMP,
                    comp(n=2, temperature=0.8, max_tokens=4, stream=True, **ids_usage),
                    n_stream_shape(2),
                ),
            ),
        ),
        Case(
            "n2_temperature0",
            (
                Req("chat", CHAT, chat(n=2, max_tokens=4), n_greedy_shape),
                Req("completions", COMP, comp(n=2, max_tokens=4), n_greedy_shape),
            ),
            answered_by_design=True,
        ),
        Case(
            "tool_required_defs",
            (
                Req(
                    "chat",
                    CHAT,
                    chat(max_tokens=64, tools=TOOLS, tool_choice="required"),
                    tool_calls_shape(TOOL_SCHEMA, "set_color"),
                ),
                Req(
                    "streamed",
                    CHAT,
                    chat(max_tokens=64, tools=TOOLS, tool_choice="required", stream=True),
                    tool_calls_shape(TOOL_SCHEMA, "set_color"),
                ),
            ),
        ),
        Case(
            "tool_named_cut",
            tuple(
                Req(
                    label,
                    CHAT,
                    chat(max_tokens=None, max_completion_tokens=2, tools=TOOLS, tool_choice=NAMED, **extra),
                    cut_call_shape,
                )
                for label, extra in (("chat", {}), ("streamed", {"stream": True}))
            ),
        ),
        Case(
            "completions_logprobs0",
            (
                Req("completions", COMP, comp(max_tokens=3, logprobs=0), completion_logprobs_shape),
                Req(
                    "streamed",
                    COMP,
                    comp(max_tokens=3, logprobs=0, stream=True, stream_options={"include_usage": True}),
                    completion_logprobs_shape,
                ),
            ),
        ),
        Case(
            "completions_echo_logprobs",
            (Req("completions", COMP, comp(max_tokens=2, logprobs=1, echo=True), echo_logprobs_shape(PROMPT)),),
        ),
        Case(
            "vocab_ids",
            (
                Req(
                    "logit_bias in vocab", CHAT, chat(max_tokens=2, logit_bias={"151669": 5, "151935": -5}), status_only
                ),
                Req("stop_token_ids in vocab", CHAT, chat(max_tokens=2, stop_token_ids=[151669, 151935]), status_only),
                Req("logit_bias >= vocab", CHAT, chat(max_tokens=2, logit_bias={str(VOCAB): 1}), error_shape),
                Req("stop_token_ids >= vocab", CHAT, chat(max_tokens=2, stop_token_ids=[VOCAB]), error_shape),
                Req("compl. logit_bias >= vocab", COMP, comp(max_tokens=2, logit_bias={str(VOCAB): 1}), error_shape),
            ),
        ),
        Case("version", (Req("GET /version", "/version", None, version_shape),)),
        Case("models", (Req("GET /v1/models", "/v1/models", None, models_shape),)),
        Case(
            "use_beam_search",
            (Req("chat", CHAT, chat(max_tokens=2, use_beam_search=True), basic),),
            refusable=("use_beam_search",),
        ),
        Case(
            "prompt_embeds",
            (Req("completions", COMP, comp(max_tokens=2, prompt_embeds="AAAA"), basic),),
            refusable=("prompt_embeds",),
        ),
        Case(
            "vllm_xargs",
            (Req("chat", CHAT, chat(max_tokens=2, vllm_xargs={"foo": 1}), basic),),
            refusable=("vllm_xargs",),
        ),
        Case(
            "kv_transfer_params",
            (Req("chat", CHAT, chat(max_tokens=2, kv_transfer_params={"do_remote_decode": False}), basic),),
            refusable=("kv_transfer_params",),
        ),
    ]


# -- verdicts --------------------------------------------------------------------------------


def alike(sg: Any, vl: Any, key: str = "") -> bool:
    """Two shapes agree: equal, key by key, except INFO_KEYS (shown only) and a `param` that
    vLLM leaves null or that sparkgate names more precisely (`stop_token_ids[0]` for
    `stop_token_ids`, `structured_outputs.regex` for `structured_outputs`): the same field."""
    if isinstance(sg, dict) and isinstance(vl, dict):
        keys = (set(sg) | set(vl)) - INFO_KEYS
        return all(alike(sg.get(k), vl.get(k), k) for k in keys)
    if key == "param" and (vl is None or (isinstance(sg, str) and re.match(rf"{re.escape(vl)}[.\[]", sg))):
        return True
    return bool(sg == vl)


def names_field(a: Answer, fields: Sequence[str]) -> bool:
    """A 400 whose error names one of `fields` (in param or the message)."""
    if a.status != 400:
        return False
    e = error_of(a)
    text = f"{e.get('param') or ''} {e.get('message') or ''}"
    return any(f in text for f in fields)


def verdict(case: Case, sg: Sequence[Answer], vl: Sequence[Answer]) -> str:
    """ "yes", "no", "refused-documented" (sparkgate refuses the case's field by design, a 400
    naming it on every request, where vLLM answers otherwise) or "answered-documented"
    (sparkgate answers, by design, what vLLM refuses with a 400)."""
    sg_shapes = [r.check(a) for r, a in zip(case.requests, sg, strict=True)]
    vl_shapes = [r.check(a) for r, a in zip(case.requests, vl, strict=True)]
    if all(alike(s, v) for s, v in zip(sg_shapes, vl_shapes, strict=True)):
        return "yes"
    if case.refusable and all(names_field(a, case.refusable) for a in sg):
        return "refused-documented"
    if case.answered_by_design and all(a.status == 200 for a in sg) and all(a.status == 400 for a in vl):
        return "answered-documented"
    return "no"


def cell(case: Case, answers: Sequence[Answer]) -> str:
    """A table cell: each request's shape, `k=v` pairs, requests separated by `;`."""
    parts = []
    for r, a in zip(case.requests, answers, strict=True):
        shape = r.check(a)
        text = " ".join(
            f"{k}={json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v}" for k, v in shape.items()
        )
        parts.append(f"**{r.label}**: {text}" if len(case.requests) > 1 else text)
    return "<br>".join(parts).replace("|", "\\|")


def trim(value: Any, max_list: int = 6, max_str: int = 300) -> Any:
    """A JSON value cut for a report: long lists keep their first and last items, long strings
    their start."""
    if isinstance(value, dict):
        return {k: trim(v, max_list, max_str) for k, v in value.items()}
    if isinstance(value, list):
        items = [trim(v, max_list, max_str) for v in value]
        if len(items) > max_list:
            head, tail = max_list // 2, max_list - max_list // 2 - 1
            items = [*items[:head], f"... {len(items) - head - tail} more ...", *items[len(items) - tail :]]
        return items
    if isinstance(value, str) and len(value) > max_str:
        return value[:max_str] + f"... ({len(value)} chars)"
    return value


def summary(verdicts: Sequence[str]) -> str:
    yes = sum(v == "yes" for v in verdicts)
    refused = sum(v == "refused-documented" for v in verdicts)
    answered = sum(v == "answered-documented" for v in verdicts)
    return f"alike: {yes} of {len(verdicts)} (refused by design: {refused}; answered where vLLM refuses: {answered})"


def sparkgate_failed(answers: dict[str, list[Answer]]) -> list[str]:
    """Requests sparkgate answered with a 5xx or not at all."""
    return [
        f"{name}#{i}: {a.status or a.error}"
        for name, ans in answers.items()
        for i, a in enumerate(ans)
        if a.status == 0 or a.status >= 500
    ]


# -- servers ---------------------------------------------------------------------------------


def engine_model() -> dict[str, Any]:
    """config/default.yaml's first model (sparkgate-tiny), its path absolute."""
    from benchmarks.vs_vllm_server import engine_model as model

    return model()


def vllm_args(model: dict[str, Any], port: int) -> list[str]:
    """vLLM's OpenAI server on the model's settings, as benchmarks/agent_sessions.py starts it,
    plus what sparkgate's in-process engine sets (engine_adapter/vllm_local.py): seed 0 and
    JSON without free whitespace."""
    from gateway.settings import ModelSettings

    m = ModelSettings(**model)
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", m.path]
    args += ["--served-model-name", m.name, "--dtype", m.dtype, "--max-model-len", str(m.max_model_len)]
    args += ["--max-num-seqs", str(m.max_num_seqs), "--enforce-eager" if m.enforce_eager else "--no-enforce-eager"]
    args += ["--enable-prefix-caching" if m.enable_prefix_caching else "--no-enable-prefix-caching"]
    if m.kv_cache_bytes is not None:
        args += ["--kv-cache-memory-bytes", str(m.kv_cache_bytes)]
    args += ["--seed", "0", "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}']
    args += ["--enable-prompt-tokens-details", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    args += ["--host", "127.0.0.1", "--port", str(port), "--api-key", KEY]
    args += ["--uvicorn-log-level", "warning", "--disable-uvicorn-access-log"]
    return args


@contextlib.contextmanager
def sparkgate_server(tmp: Path, ref: str = "") -> Iterator[str]:
    """`sparkgate serve` on the model, the working tree's or (`ref`) a git ref's."""
    from benchmarks.agent_sessions import sparkgate_config
    from benchmarks.gateway_process import free_port, launch

    port = free_port()
    log(f"sparkgate{' ' + ref if ref else ''}: starting on :{port} (its vLLM CPU engine in-process)")
    config = sparkgate_config(tmp, port, engine_model())
    with launch(config, tmp / "gateway.log", port, ref=ref, startup_timeout_s=STARTUP_TIMEOUT_S) as gw:
        yield gw.base_url


@contextlib.contextmanager
def vllm_server(tmp: Path) -> Iterator[str]:
    from benchmarks.gateway_process import child, free_port

    port = free_port()
    log(f"vllm: starting its OpenAI server on :{port}")
    ready = f"http://127.0.0.1:{port}/health"
    with child(vllm_args(engine_model(), port), tmp / "vllm.log", ready, startup_timeout_s=STARTUP_TIMEOUT_S):
        yield f"http://127.0.0.1:{port}"


def run_cases(base: str, selected: Sequence[Case], who: str) -> dict[str, list[Answer]]:
    import httpx

    out: dict[str, list[Answer]] = {}
    with httpx.Client(timeout=300) as client:
        for case in selected:
            t0 = time.perf_counter()
            out[case.name] = [send(client, base, r.path, r.body) for r in case.requests]
            statuses = " ".join(str(a.status) for a in out[case.name])
            log(f"{who} {case.name}: {statuses} ({time.perf_counter() - t0:.1f}s)")
    return out


@contextlib.contextmanager
def served(
    url: str | None, start: Callable[[Path], contextlib.AbstractContextManager[str]], tmp: Path
) -> Iterator[str]:
    if url:
        yield url.rstrip("/")
    else:
        with start(tmp) as base:
            yield base


# -- main ------------------------------------------------------------------------------------


def report(
    selected: Sequence[Case], sg: dict[str, list[Answer]], vl: dict[str, list[Answer]]
) -> tuple[str, list[dict[str, Any]]]:
    lines = ["| case | sparkgate | vLLM | alike? |", "|---|---|---|---|"]
    rows: list[dict[str, Any]] = []
    verdicts = []
    for case in selected:
        v = verdict(case, sg[case.name], vl[case.name])
        verdicts.append(v)
        lines.append(f"| {case.name} | {cell(case, sg[case.name])} | {cell(case, vl[case.name])} | {v} |")
        rows.append(
            {
                "case": case.name,
                "alike": v,
                "requests": [
                    {
                        "label": r.label,
                        "method": "GET" if r.body is None else "POST",
                        "path": r.path,
                        "body": r.body,
                        "sparkgate": {"shape": r.check(a), "answer": trim(a.to_json())},
                        "vllm": {"shape": r.check(b), "answer": trim(b.to_json())},
                    }
                    for r, a, b in zip(case.requests, sg[case.name], vl[case.name], strict=True)
                ],
            }
        )
    lines += ["", summary(verdicts)]
    return "\n".join(lines), rows


def main() -> None:
    all_cases = cases()
    names = [c.name for c in all_cases]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=names, metavar="CASE", help="run these cases: " + ", ".join(names))
    ap.add_argument("--json", type=Path, help="write every case's requests, shapes and answers (trimmed) here")
    ap.add_argument("--sparkgate-url", help="a sparkgate already running (else one is started)")
    ap.add_argument(
        "--sparkgate-ref", default="", help="start sparkgate as of this git ref (default: the working tree)"
    )
    ap.add_argument("--vllm-url", help="a vLLM OpenAI server already running (else one is started)")
    args = ap.parse_args()
    selected = [c for c in all_cases if not args.only or c.name in args.only]

    from gateway import runtime_env

    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is for the table
    runtime_env.configure(ROOT / ".cache")
    with tempfile.TemporaryDirectory(prefix="sparkgate-parity-") as d:
        tmp = Path(d)
        start = functools.partial(sparkgate_server, ref=args.sparkgate_ref)
        with served(args.sparkgate_url, start, tmp) as base:
            sg = run_cases(base, selected, "sparkgate")
        with served(args.vllm_url, vllm_server, tmp) as base:
            vl = run_cases(base, selected, "vllm")
    from benchmarks.agent_sessions import vllm_version

    table, rows = report(selected, sg, vl)
    print(
        f"sparkgate vs vLLM {vllm_version()}'s OpenAI server on models/tiny-qwen3 (random weights): "
        f"{len(selected)} cases\n"
    )
    print(table)
    if args.json:
        args.json.write_text(json.dumps({"vllm_version": vllm_version(), "cases": rows}, indent=1, ensure_ascii=False))
    if failed := sparkgate_failed(sg):
        log("FAILED: sparkgate answered with a 5xx or not at all: " + "; ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
