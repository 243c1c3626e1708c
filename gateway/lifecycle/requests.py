"""OpenAI request models (chat, completions) as clients send them.

Unknown fields are accepted and ignored: OpenAI SDKs and chat frontends send
fields (`store`, `metadata`, `parallel_tool_calls`, ...) this gateway has no
use for, and refusing them would break those clients. What is read is checked
with OpenAI's rules: strict types (`"stream": "yes"` and `"n": 2.0` are errors,
as they are there), OpenAI's ranges, finite numbers, integers the engine can
carry (64-bit). Limits from the settings (`limits:`) and checks that need the
model's vocabulary are in gateway/lifecycle/prepare.py. Responses are built as
plain dicts in `bodies.py` (hot path; they are never parsed back).
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]  # the vocabulary's bound is checked in prepare
_TOKEN_ID_KEY = re.compile(r"[0-9]{1,10}")
TokenIdKey = Annotated[str, Field(pattern=r"^[0-9]{1,10}$")]  # logit_bias: a token id as JSON keys are


def _engine_safe(value: Any) -> Any:
    """Free-form JSON (tool parameters, a response schema, template kwargs) goes to the engine
    or its grammar compiler: integers there must fit 64 bits (vLLM cannot carry larger ones),
    numbers must be finite (Python's JSON parser reads NaN and 1e999)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, int) and not isinstance(v, bool) and not INT64_MIN <= v <= INT64_MAX:
            raise ValueError(f"integers must be within the 64-bit range, got {v}")
        elif isinstance(v, float) and not math.isfinite(v):
            raise ValueError("numbers must be finite (not NaN or Infinity)")
    return value


FreeJson = Annotated[dict[str, Any], AfterValidator(_engine_safe)]


def _is_bias(b: Any) -> bool:
    """A logit_bias value the field accepts."""
    return isinstance(b, int | float) and not isinstance(b, bool) and -100 <= b <= 100


class _Request(BaseModel):
    # strict: no coercion (a string is not a boolean or a number, 2.0 is not an integer);
    # allow_inf_nan off: `1e999` parses to infinity, which no sampling field means.
    model_config = ConfigDict(extra="ignore", populate_by_name=True, strict=True, allow_inf_nan=False)


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: the usage so far on every chunk (with include_usage)


class ImageURL(_Request):
    url: str
    # Accepted and not used: Qwen's processor sizes an image by its pixels alone.
    detail: Literal["auto", "low", "high"] | None = None


class ContentPart(_Request):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None
    # OpenAI's {"url": ...}; some frontends send the URL alone.
    image_url: ImageURL | str | None = None

    @property
    def url(self) -> str | None:
        return self.image_url.url if isinstance(self.image_url, ImageURL) else self.image_url


FunctionName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_.:-]{1,64}$")]


class ToolCallFunction(_Request):
    name: str
    arguments: str = "{}"


class ToolCall(_Request):
    id: str | None = None
    type: str = "function"
    function: ToolCallFunction


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # A past answer's reasoning, as this gateway returned it (either name).
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDefinition(_Request):
    name: FunctionName
    description: str | None = None
    parameters: FreeJson | None = None
    strict: bool | None = None


class ChatTool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def _tool_choice(v: Any) -> Any:
    """One clear message for a bad tool_choice (a union would report each member's error)."""
    if v is None or v in ("none", "auto", "required") or isinstance(v, NamedToolChoice):
        return v
    function = v.get("function") if isinstance(v, dict) else None
    named = isinstance(v, dict) and v.get("type") == "function"
    if named and isinstance(function, dict) and isinstance(function.get("name"), str):
        return NamedToolChoice.model_validate(v)
    raise ValueError('must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}')


class JsonSchemaFormat(_Request):
    name: str = "response"
    description: str | None = None
    schema_: FreeJson | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    # vLLM's structural tag: xgrammar's `format`, or its older `structures` + `triggers`.
    format: FreeJson | None = None
    structures: list[FreeJson] | None = None
    triggers: list[str] | None = None

    @model_validator(mode="after")
    def _schema_present(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError("response_format of type json_schema needs json_schema.schema")
        if self.type == "structural_tag" and self.format is None and (self.structures is None or self.triggers is None):
            raise ValueError("response_format of type structural_tag needs format, or structures and triggers")
        return self

    @property
    def structural_tag(self) -> str:
        """The structural tag as vLLM's engine takes it: the response format as JSON text."""
        if self.format is not None:
            return json.dumps({"type": "structural_tag", "format": self.format})
        return json.dumps({"type": "structural_tag", "structures": self.structures, "triggers": self.triggers})


class StructuredOutputs(_Request):
    """vLLM's `structured_outputs`: exactly one constraint, and its options. Whether the
    constraint compiles is checked by the engine (400 before the request is admitted)."""

    json_: FreeJson | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1)
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    @model_validator(mode="after")
    def _one_constraint(self) -> StructuredOutputs:
        given = [
            name
            for name, value in (
                ("json", self.json_),
                ("regex", self.regex),
                ("choice", self.choice),
                ("grammar", self.grammar),
                ("json_object", self.json_object),
                ("structural_tag", self.structural_tag),
            )
            if value is not None
        ]
        if len(given) != 1:
            listed = ", ".join(given) or "none"
            raise ValueError(
                f"give exactly one of json, regex, choice, grammar, json_object, structural_tag (given: {listed})"
            )
        return self

    @property
    def json_schema(self) -> dict[str, Any] | None:
        """The JSON schema (given as an object or as JSON text)."""
        if isinstance(self.json_, str):
            try:
                value = _engine_safe(json.loads(self.json_))
            except ValueError as e:
                raise ValueError(f"structured_outputs.json is not a JSON schema: {e}") from None
            if not isinstance(value, dict):
                raise ValueError("structured_outputs.json must be a JSON object")
            return value
        return self.json_


# vLLM's fields this gateway does not honour: a request that sets one to anything but its
# default gets a 400 naming it (docs/api.md lists them), never a silent 200.
REFUSED_FIELDS: dict[str, Any] = {
    "use_beam_search": False,
    "length_penalty": 1.0,
    "allowed_token_ids": None,
    "bad_words": [],
    "logprob_token_ids": None,
    "prompt_embeds": None,
    "spaces_between_special_tokens": True,
    "priority": 0,  # the admission class comes from the key and the priority header
    "request_id": None,
    "session_id": None,
    "cache_salt": None,  # the gateway salts the prefix cache per team or user (prefix.cache_isolation)
    "kv_transfer_params": None,
    "ec_transfer_params": None,
    "vllm_xargs": None,
    "repetition_detection": None,
    "stream_interval": None,
    "thinking_token_budget": None,
    "return_tokens_as_token_ids": False,
    "return_token_offsets": False,
    "return_prompt_text": False,
    "routed_experts_prompt_start": 0,
    "mm_payload": None,
    "return_mm_kwargs": False,
    "watermarking": None,
    "media_io_kwargs": None,
    "mm_processor_kwargs": None,
    "documents": None,  # chat
    "chat_template": None,  # chat: the model's own template renders every prompt
    "add_special_tokens": None,  # chat's default False, completions' True: either is what it does
    "guided_json": None,  # vLLM's names before structured_outputs
    "guided_regex": None,
    "guided_choice": None,
    "guided_grammar": None,
    "guided_decoding_backend": None,
}
_SPECIAL_DEFAULTS = {"chat": {"add_special_tokens": False}, "completion": {"add_special_tokens": True}}


def refused_fields(data: Any, kind: str) -> list[str]:
    """The refused fields `data` sets to something other than their defaults."""
    if not isinstance(data, dict):
        return []
    defaults = REFUSED_FIELDS | _SPECIAL_DEFAULTS[kind]
    return [k for k, default in defaults.items() if k in data and data[k] is not None and data[k] != default]


class SamplingFields(_Request):
    """Fields shared by chat and completions (OpenAI's plus vLLM's extensions)."""

    model: str
    n: int = Field(1, ge=1, le=INT32_MAX)  # limits.max_n is checked in prepare
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # Keys are token ids (strings in JSON); whether they are in the vocabulary is checked in prepare.
    logit_bias: dict[TokenIdKey, Annotated[float, Field(ge=-100, le=100)]] | None = None
    user: str | None = None
    # OpenAI's tiers: named, an unknown one is a 400; there is one tier here, whichever is asked.
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    # vLLM extensions, accepted by its OpenAI server too.
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)
    min_tokens: int = Field(0, ge=0, le=INT32_MAX)
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    response_format: ResponseFormat | None = None  # completions too, as vLLM takes it
    structured_outputs: StructuredOutputs | None = None
    # Logprobs of the prompt's tokens: the k likeliest at each place, and the prompt's own.
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    return_token_ids: bool | None = None
    # Keep this many of the prompt's tokens (-1: as many as the context allows), from the
    # `truncation_side` (left: the last ones; right: the first; default: the tokenizer's).
    truncate_prompt_tokens: int | None = Field(None, ge=-1, le=INT64_MAX)
    truncation_side: Literal["left", "right"] | None = None

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _bad_keys_named(cls, v: Any) -> Any:
        # Pydantic reports each bad key apart and the 400 names only the first; with several,
        # one error names them all (as vLLM's does), so a client fixes them in one go.
        if not isinstance(v, dict):
            return v
        keys = [k for k in v if not (isinstance(k, str) and _TOKEN_ID_KEY.fullmatch(k))]
        not_ids = set(keys)  # a set: a body may hold very many keys
        biases = [k for k, b in v.items() if k not in not_ids and not _is_bias(b)]
        if len(keys) + len(biases) > 1:
            named = [f"keys that are not token ids (integers from 0): {', '.join(map(repr, keys))}"] if keys else []
            if biases:
                named.append(f"keys whose bias is not a number from -100 to 100: {', '.join(map(repr, biases))}")
            raise ValueError("; ".join(named))
        return v

    @field_validator("prompt_logprobs")
    @classmethod
    def _not_streamed(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and info.data.get("stream"):
            raise ValueError("prompt_logprobs are not available when stream is true")
        return v

    @field_validator("stream_options")
    @classmethod
    def _needs_stream(cls, v: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        # As OpenAI and vLLM answer (a validator on the field, so the error names it).
        if v is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return v

    @property
    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """The usage so far on every chunk (vLLM's `continuous_usage_stats`, with include_usage)."""
        return self.include_usage and bool(self.stream_options and self.stream_options.continuous_usage_stats)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=INT64_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT64_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[ChatTool] | None = None
    tool_choice: Annotated[ToolChoice | None, BeforeValidator(_tool_choice)] = None
    parallel_tool_calls: bool | None = None
    # "none" turns thinking off; the other efforts leave it on (Qwen models have no levels).
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    chat_template_kwargs: FreeJson | None = None
    # vLLM's: the last message's text before the answer (its role must be the answer's).
    echo: bool = False
    add_generation_prompt: bool = True
    # Go on writing the last (assistant) message instead of starting a new one.
    continue_final_message: bool = False

    @model_validator(mode="after")
    def _continuation(self) -> ChatCompletionRequest:
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        return self

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v and not info.data.get("logprobs"):
            raise ValueError("top_logprobs requires logprobs to be true")
        return v

    @property
    def function_tools(self) -> dict[str, dict[str, Any]]:
        """Each tool's parameters schema by function name."""
        return {t.function.name: t.function.parameters or {} for t in self.tools or ()}

    @property
    def forced_function(self) -> str | None:
        """The function a named tool_choice forces."""
        return self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else None

    @property
    def thinking(self) -> bool | None:
        """Whether the request asks for thinking (None: the template's default)."""
        kwargs = self.chat_template_kwargs or {}
        if "enable_thinking" in kwargs:
            return bool(kwargs["enable_thinking"])
        if self.reasoning_effort is not None:
            return self.reasoning_effort != "none"
        return None

    @property
    def requested_max_tokens(self) -> int | None:
        # max_completion_tokens is the newer name; it wins when both are given.
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingFields):
    # Token ids before strings: pydantic tries the members in order, and a 32K-id prompt
    # checked against list[str] first cost 2.6 ms of the event loop's time to fail.
    prompt: str | list[TokenId] | list[list[TokenId]] | list[str]
    max_tokens: int | None = Field(16, ge=1, le=INT64_MAX)  # OpenAI's default for completions
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)  # OpenAI's maximum for completions
    best_of: int | None = Field(None, ge=1, le=INT32_MAX)
    suffix: str | None = None

    @model_validator(mode="after")
    def _checks(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and len(self.prompt) == 0:
            raise ValueError("prompt must not be empty")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of other than n is not supported")
        if self.suffix:
            raise ValueError("suffix is not supported")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """Normalize the four prompt shapes OpenAI allows to a list."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        # Validation made the (non-empty) list one member of the union: its first item says
        # which, without a walk over every id of a 32K-id prompt on the event loop.
        if isinstance(p[0], int):
            return [p]
        return list(p)
