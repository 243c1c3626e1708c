"""The prepare phase: an API request becomes a `Job`, with no hold taken on anything.

    resolve the model(s) it may use -> check limits -> normalize the prompt -> tokenize once
      -> route (pick the model by SLO; the ids are counted again only if its vocabulary differs)
      -> budget (fit the context, cap max_tokens) -> engine requests

Every API surface builds its job here; `gateway.lifecycle.run` takes it from there.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from engine_adapter.base import (
    EngineRequest,
    EngineRequestInvalid,
    SamplingOptions,
    StructuredOutput,
)
from gateway.auth import Principal
from gateway.errors import ContextLengthExceeded, InvalidRequest, ModelNotFound
from gateway.job import Job
from gateway.lifecycle import images
from gateway.lifecycle.images import IMAGE_ROLES, ImageSource
from gateway.lifecycle.requests import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields, ToolCall
from gateway.registry import ModelRegistry, ServedModel
from gateway.router import Router
from gateway.settings import PRIORITY_CLASSES, LimitSettings
from gateway.text.assistant import TurnSpec
from gateway.text.templates import history_prefix
from policies import kv, prefix, tokens
from policies.context import ContextTooLong, OutputTooLong, TruncationTooLong, plan_output, truncate
from policies.demand import Demand
from policies.load import RouteInfo, RouteQuery

# A prompt this short (characters, no tools) is normalized, rendered and tokenized on the event
# loop: 25 µs for a one-line chat, ~0.3 ms at this limit (2 loaded cores), less than the hop to a
# worker thread and back, which under load also waits for the GIL. Longer ones go to a thread,
# so as not to stall the loop.
INLINE_CHARS = 1000


def _messages_for_template(messages: Sequence[ChatMessage]) -> tuple[list[dict[str, Any]], list[ImageSource]]:
    """The messages as the chat template takes them, and the images in them in the order the
    template places them (a content list with an image part stays a list: text parts and
    `{"type": "image"}`, which the template writes as one image pad)."""
    out = []
    images: list[ImageSource] = []
    for i, m in enumerate(messages):
        content: Any = m.content
        # OpenAI's rules: only an assistant message may leave its content out (it calls tools
        # instead), and a tool message names the call it answers.
        if content is None and m.role != "assistant":
            raise _missing(f"messages[{i}].content")
        if m.role == "tool" and not m.tool_call_id:
            raise _missing(f"messages[{i}].tool_call_id")
        if isinstance(content, list):
            parts: list[dict[str, Any]] = []
            for j, part in enumerate(content):
                param = f"messages[{i}].content[{j}]"
                if part.type == "text" and part.text is not None:
                    parts.append({"type": "text", "text": part.text})
                elif part.type == "image_url" and part.url is not None and m.role in IMAGE_ROLES:
                    parts.append({"type": "image"})
                    images.append(ImageSource(param=f"{param}.image_url", url=part.url))
                elif part.type == "image_url" and part.url is not None:
                    raise InvalidRequest(
                        f"Images are accepted in user messages, not in a message of role '{m.role}'.",
                        param=param,
                        code="unsupported_content",
                    )
                else:
                    raise InvalidRequest(
                        f"Content of type '{part.type}' is not supported by this model.",
                        param=param,
                        code="unsupported_content",
                    )
            has_image = any(p["type"] == "image" for p in parts)
            content = parts if has_image else "".join(p["text"] for p in parts)
        # Qwen templates know no "developer" role; OpenAI treats it as system.
        role = "system" if m.role == "developer" else m.role
        msg: dict[str, Any] = {"role": role, "content": content or ""}
        if m.tool_calls:
            msg["tool_calls"] = [_template_call(tc) for tc in m.tool_calls]
        if reasoning := m.reasoning_content or m.reasoning:
            msg["reasoning_content"] = reasoning
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        if m.name:
            msg["name"] = m.name
        out.append(msg)
    return out, images


def _missing(param: str) -> InvalidRequest:
    return InvalidRequest(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")


def _template_call(tc: ToolCall) -> dict[str, Any]:
    """A past call as templates take it: arguments as an object where they parse (Qwen's
    XML templates iterate them; the JSON ones write either form)."""
    call = tc.model_dump()
    try:
        args = json.loads(tc.function.arguments)
    except ValueError:
        return call
    if isinstance(args, dict):
        call["function"]["arguments"] = args
    return call


def _tools_checked(req: ChatCompletionRequest) -> None:
    """OpenAI's rules for tools and tool_choice (400 naming the parameter)."""
    names = [t.function.name for t in req.tools or ()]
    if len(set(names)) != len(names):
        raise InvalidRequest("Function names in 'tools' must be unique.", param="tools")
    forced = req.forced_function
    if forced is not None and forced not in names:
        raise InvalidRequest(
            f"Invalid value for 'tool_choice': no function named '{forced}' in 'tools'.", param="tool_choice"
        )
    if req.tool_choice == "required" and not names:
        raise InvalidRequest("tool_choice 'required' needs at least one tool in 'tools'.", param="tool_choice")


def _forced_schema(req: ChatCompletionRequest) -> dict[str, Any] | None:
    """The grammar of a forced call (vLLM's server uses the same): a named function's
    arguments object, or for "required" an array of {name, parameters} calls."""
    tools = req.function_tools
    forced = req.forced_function
    if forced is not None:
        return tools[forced] or {"type": "object"}
    if req.tool_choice != "required":
        return None
    calls = []
    defs: dict[str, Any] = {}
    for name, params in tools.items():
        parameters, own = _hoisted_defs(name, dict(params or {"type": "object"}))
        defs |= own
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"type": "string", "enum": [name]}, "parameters": parameters},
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if defs:
        schema["$defs"] = defs
    if req.parallel_tool_calls is False:
        schema["maxItems"] = 1
    return schema


def _hoisted_defs(tool: str, params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A tool's parameters nested in the "required" grammar, and its `$defs` (or `definitions`,
    as pydantic writes them) moved to the grammar's root: a `$ref` like `#/$defs/City` points at
    the root of the whole schema, where the tool's own defs no longer are. Each is renamed
    `{tool}.{name}` (two tools may both have a `City`) and its refs rewritten."""
    own = {**params.pop("definitions", {}), **params.pop("$defs", {})}
    if not own:
        return params, {}
    renamed = {f"#/{kind}/{name}": f"#/$defs/{tool}.{name}" for kind in ("$defs", "definitions") for name in own}

    def rewrite(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: renamed.get(v, v) if k == "$ref" else rewrite(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rewrite(v) for v in value]
        return value

    return rewrite(params), {f"{tool}.{name}": rewrite(d) for name, d in own.items()}


def _turn(served: ServedModel, req: ChatCompletionRequest, prompt: tokens.Prompt) -> TurnSpec:
    """How this request's output is read: where reasoning starts, which tool calls to parse."""
    formats = served.formats
    reasoning = formats.reasoning_start(tokens.text_of(served.tokenizer, prompt)) if formats.reasoning else "none"
    forced: Literal["named", "required"] | None = None
    if req.forced_function is not None:
        forced = "named"
    elif req.tool_choice == "required":
        forced = "required"
    parse_calls = bool(req.tools) and req.tool_choice != "none" and forced is None
    return TurnSpec(
        reasoning=reasoning,
        reasoning_format=formats.reasoning_format,
        tool_format=formats.tool_format if parse_calls else None,
        tools=req.function_tools,
        forced=forced,
        forced_name=req.forced_function,
        think_end_id=formats.think_end_id,
        parallel=req.parallel_tool_calls is not False,
    )


def _structured(req: SamplingFields) -> StructuredOutput | None:
    """The output's constraint: OpenAI's `response_format` or vLLM's `structured_outputs`."""
    rf = req.response_format
    so = req.structured_outputs
    if rf is not None and rf.type != "text" and so is not None:
        raise InvalidRequest(
            "Give the output's constraint either as 'response_format' or as 'structured_outputs', not both.",
            param="structured_outputs",
        )
    if so is not None:
        try:
            schema = so.json_schema
        except ValueError as e:
            raise InvalidRequest(str(e), param="structured_outputs.json") from None
        return StructuredOutput(
            json_object=bool(so.json_object),
            json_schema=schema,
            regex=so.regex,
            choice=None if so.choice is None else tuple(so.choice),
            grammar=so.grammar,
            structural_tag=so.structural_tag,
            disable_any_whitespace=so.disable_any_whitespace,
            disable_additional_properties=so.disable_additional_properties,
            whitespace_pattern=so.whitespace_pattern,
        )
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return StructuredOutput(json_object=True)
    if rf.type == "structural_tag":
        return StructuredOutput(structural_tag=rf.structural_tag)
    assert rf.json_schema is not None and rf.json_schema.schema_ is not None
    return StructuredOutput(json_schema=rf.json_schema.schema_)


def _constraint_param(req: SamplingFields, forced: bool = False) -> str:
    """The field a request's output constraint came from, for its errors."""
    if forced:
        return "tool_choice"
    return "structured_outputs" if req.structured_outputs is not None else "response_format"


async def _engine_checked(served: ServedModel, request: EngineRequest, param: str) -> None:
    """The engine's own checks of a constrained request (compiling its grammar takes
    milliseconds: off the event loop), so a bad regex, schema or grammar is a 400 before
    admission rather than an error in the middle of a stream."""
    if request.sampling.structured is None:
        return
    try:
        await asyncio.to_thread(served.engine.check, request)
    except EngineRequestInvalid as e:
        raise InvalidRequest(f"Invalid '{param}': {e}", param=param) from e


def _logit_bias(raw: dict[str, float] | None) -> dict[int, float] | None:
    # The keys are digits (the schema checks) in the vocabulary (_check_vocabulary).
    return {int(k): float(v) for k, v in raw.items()} if raw else None


def _sampling(
    req: SamplingFields,
    *,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None,
    structured: StructuredOutput | None = None,
) -> SamplingOptions:
    return SamplingOptions(
        max_tokens=max_tokens,
        n=req.n,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=req.top_k or 0,  # at most the vocabulary (_check_vocabulary)
        min_p=req.min_p or 0.0,
        seed=req.seed,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        stop=req.stop_list,
        stop_token_ids=tuple(req.stop_token_ids or ()),
        include_stop_str_in_output=req.include_stop_str_in_output,
        ignore_eos=req.ignore_eos,
        min_tokens=min(req.min_tokens, max_tokens),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        logit_bias=_logit_bias(req.logit_bias),
        structured=structured or _structured(req),
        skip_special_tokens=req.skip_special_tokens,
    )


def _context_limit(served: ServedModel, principal: Principal) -> int:
    limits = [served.engine.max_model_len, served.settings.max_context, principal.max_context]
    return min(x for x in limits if x is not None)


def _budget(served: ServedModel, principal: Principal, prompt: tokens.Prompt, requested: int | None, param: str) -> int:
    plan = plan_output(
        prompt_tokens=len(prompt),
        requested=requested,
        max_model_len=_context_limit(served, principal),
        max_output_cap=served.settings.max_output_tokens,
    )
    if isinstance(plan, ContextTooLong):
        raise ContextLengthExceeded(plan.message, param=param)
    if isinstance(plan, OutputTooLong):
        raise InvalidRequest(plan.message, param="max_tokens")
    return plan.max_tokens


def _truncated(served: ServedModel, principal: Principal, prompt: tokens.Prompt, req: SamplingFields) -> tokens.Prompt:
    """The prompt cut to `truncate_prompt_tokens` (vLLM's rule); it is counted, charged and
    reserved as cut."""
    if req.truncate_prompt_tokens is None:
        return prompt
    if prompt.images:
        raise InvalidRequest(
            "truncate_prompt_tokens cannot cut a prompt with images (a cut may not split one).",
            param="truncate_prompt_tokens",
        )
    side = req.truncation_side or getattr(served.tokenizer, "truncation_side", None) or "right"
    ids = truncate(
        prompt.token_ids, keep=req.truncate_prompt_tokens, side=side, max_model_len=_context_limit(served, principal)
    )
    if isinstance(ids, TruncationTooLong):
        raise InvalidRequest(ids.message, param="truncate_prompt_tokens")
    if len(ids) == len(prompt):
        return prompt
    if not ids:
        raise InvalidRequest("truncate_prompt_tokens=0 leaves no prompt.", param="truncate_prompt_tokens")
    return tokens.from_ids(ids)


def _resolve(registry: ModelRegistry, model: str, principal: Principal) -> ServedModel:
    served = registry.resolve(model)
    if not principal.may_use(served.settings.names):
        raise ModelNotFound(f"The model '{model}' does not exist or you do not have access to it.", param="model")
    return served


def _at_most(count: int, limit: int, what: str, param: str) -> None:
    if count > limit:
        raise InvalidRequest(f"Invalid '{param}': at most {limit} {what} are allowed, got {count}.", param=param)


def _check_common(req: SamplingFields, limits: LimitSettings) -> None:
    """The configured limits (settings `limits:`), before anything is rendered or tokenized."""
    if req.n > limits.max_n:
        raise InvalidRequest(f"Invalid 'n': at most {limits.max_n} choices are allowed, got {req.n}.", param="n")
    _at_most(len(req.stop_list), limits.max_stop, "stop sequences", "stop")
    for i, stop in enumerate(req.stop_list):
        param = "stop" if isinstance(req.stop, str) else f"stop[{i}]"
        if not stop:
            raise InvalidRequest(f"Invalid '{param}': a stop sequence must not be empty.", param=param)
        _at_most(len(stop), limits.max_stop_chars, "characters", param)
    _at_most(len(req.stop_token_ids or ()), limits.max_stop_token_ids, "stop token ids", "stop_token_ids")
    _at_most(len(req.logit_bias or ()), limits.max_logit_bias, "logit_bias entries", "logit_bias")


def _check_vocabulary(req: SamplingFields, served: ServedModel) -> None:
    """Token ids the client gives must be the model's (an engine given others fails or crashes);
    a 400 names every one that is not."""
    vocab = served.token_ids
    bad = [key for key in req.logit_bias or () if int(key) >= vocab]
    if bad:
        raise InvalidRequest(
            f"Invalid keys in 'logit_bias': {', '.join(bad)} are not token ids of this model (0..{vocab - 1}).",
            param="logit_bias",
        )
    bad_stops = [(i, t) for i, t in enumerate(req.stop_token_ids or ()) if t >= vocab]
    if bad_stops:
        listed = ", ".join(f"stop_token_ids[{i}] = {t}" for i, t in bad_stops)
        raise InvalidRequest(
            f"Invalid 'stop_token_ids': {listed} not token ids of this model (0..{vocab - 1}).",
            param=f"stop_token_ids[{bad_stops[0][0]}]",
        )
    if req.top_k is not None and req.top_k > vocab:
        req.top_k = vocab  # the same sampling; vLLM keeps top_k in 32 bits, per token of the vocabulary


@dataclass(frozen=True)
class Routing:
    """What a request needs from routing: the router (None: routing is off) and its SLO header."""

    router: Router | None = None
    slo_header: str | None = None


NO_ROUTING = Routing()


def _candidates(registry: ModelRegistry, routing: Routing, model: str, principal: Principal) -> list[ServedModel]:
    """The models this request may go to, best first. Without routing: the one it names."""
    if routing.router is None:
        return [_resolve(registry, model, principal)]
    if not routing.router.is_alias(model):
        _resolve(registry, model, principal)  # 404 for unknown or forbidden names
    names = routing.router.candidates(model, principal, registry.resolve)
    if not names:
        raise ModelNotFound(f"The model '{model}' does not exist or you do not have access to it.", param="model")
    return [registry.resolve(n) for n in names]


def _route(
    routing: Routing,
    requested: str,
    candidates: list[ServedModel],
    principal: Principal,
    prompt: tokens.Prompt,
    requested_max_tokens: int | None,
) -> tuple[ServedModel, RouteInfo | None]:
    """Pick the model (routing on) among those whose context the prompt fits."""
    if routing.router is None:
        return candidates[0], None
    fits = [c for c in candidates if len(prompt) < _context_limit(c, principal)] or candidates[:1]
    out = requested_max_tokens or routing.router.settings.default_output_tokens
    info = routing.router.route(
        RouteQuery(
            requested=requested,
            candidates=[c.name for c in fits],
            slo_class=routing.router.slo_for(principal, routing.slo_header),
            prompt_ids=prompt.cache_keys(),
            output_tokens=out,
            salt=_cache_salt(fits[0], principal),
            user=principal.name,
        )
    )
    return next(c for c in fits if c.name == info.model), info


async def _render_for(
    served: ServedModel,
    messages: list[dict[str, Any]],
    req: ChatCompletionRequest,
    policy: prefix.PrefixPolicy | None,
) -> tuple[tokens.Prompt, tuple[str, ...]]:
    try:
        tools = _tools_for_template(req)
        args = (served, messages, tools, _template_kwargs(req), policy, _generation(req))
        if tools is None and sum(len(m["content"]) for m in messages) <= INLINE_CHARS:
            return _render(*args)
        # Tokenizing a long prompt takes milliseconds: keep the event loop free.
        return await asyncio.to_thread(_render, *args)
    except Exception as e:  # template errors (jinja) are the request's fault
        raise InvalidRequest(f"Could not render the chat template: {e}", param="messages") from e


def _tools_for_template(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    return [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None


def chat_prompt(served: ServedModel, req: ChatCompletionRequest, principal: Principal) -> tokens.Prompt:
    """The prompt `prepare_chat` sends `served` for this request: normalized under the model's
    (and the key's) prefix policy, rendered, tokenized. Synchronous, for benchmarks and tools."""
    policy = _prefix_policy(served, principal)
    messages, _ = _messages_for_template(req.messages)
    prompt, _ = _render(served, messages, _tools_for_template(req), _template_kwargs(req), policy, _generation(req))
    return prompt


def _generation(req: ChatCompletionRequest) -> tuple[bool, bool]:
    """(add_generation_prompt, continue_final_message) as the client asks them."""
    return req.add_generation_prompt, req.continue_final_message


def _chat_prompt_logprobs(req: ChatCompletionRequest) -> int | None:
    """The prompt's logprobs to ask: as given, or with an echo (as vLLM answers one: the
    prompt's logprobs at top_logprobs' k); a stream carries none."""
    if req.prompt_logprobs is not None or not req.echo or req.stream:
        return req.prompt_logprobs
    return req.top_logprobs or 0


def _echo_text(req: ChatCompletionRequest, messages: list[dict[str, Any]]) -> str:
    """What chat's `echo` puts before the answer (as vLLM does): the last message's text, when
    the answer goes on in its role (an assistant message, or any without a generation prompt)."""
    if not req.echo:
        return ""
    last = messages[-1]
    if req.add_generation_prompt and last["role"] != "assistant":
        return ""
    content = last["content"]
    if isinstance(content, list):  # with images: its text parts
        return "".join(p["text"] for p in content if p["type"] == "text")
    return str(content or "")


def _template_kwargs(req: ChatCompletionRequest) -> dict[str, Any] | None:
    """The client's template kwargs; `reasoning_effort: "none"` turns thinking off."""
    kwargs = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort == "none":
        kwargs.setdefault("enable_thinking", False)
    return kwargs or None


async def prepare_chat(
    req: ChatCompletionRequest,
    registry: ModelRegistry,
    principal: Principal,
    limits: LimitSettings,
    routing: Routing = NO_ROUTING,
) -> Job:
    candidates = _candidates(registry, routing, req.model, principal)
    _check_common(req, limits)
    _at_most(len(req.messages), limits.max_messages, "messages", "messages")
    _at_most(len(req.tools or ()), limits.max_tools, "tools", "tools")
    _tools_checked(req)
    messages, sources = _messages_for_template(req.messages)
    candidates = images.seeing(candidates, sources, req.model)
    first = candidates[0]
    read = await images.read(first, sources)
    rendered, changes = await _render_for(first, messages, req, _prefix_policy(first, principal))
    prompt = images.placed(first, rendered, read)
    served, info = _route(routing, req.model, candidates, principal, prompt, req.requested_max_tokens)
    if served.tokenizer_id != first.tokenizer_id:  # counted with another vocabulary: count again
        rendered, changes = await _render_for(served, messages, req, _prefix_policy(served, principal))
    if served is not first:  # and its processor may size the images otherwise
        prompt = images.placed(served, rendered, read)
    prompt = _truncated(served, principal, prompt, req)
    _check_vocabulary(req, served)
    max_tokens = _budget(served, principal, prompt, req.requested_max_tokens, "messages")
    top = (req.top_logprobs or 0) if req.logprobs else None
    job_id = f"chatcmpl-{uuid.uuid4().hex}"
    forced = _forced_schema(req)
    if forced is not None and req.structured_outputs is not None:
        raise InvalidRequest(
            "A forced tool call is already constrained: 'structured_outputs' cannot be combined with this tool_choice.",
            param="structured_outputs",
        )
    request = EngineRequest(
        request_id=job_id,
        prompt_token_ids=prompt.token_ids,
        sampling=_sampling(
            req,
            max_tokens=max_tokens,
            logprobs=top,
            prompt_logprobs=_chat_prompt_logprobs(req),
            structured=None if forced is None else StructuredOutput(json_schema=forced),
        ),
        cache_salt=_cache_salt(served, principal),
        images=images.engine_images(prompt, read),
    )
    await _engine_checked(served, request, _constraint_param(req, forced=forced is not None))
    job = Job(
        kind="chat",
        id=job_id,
        created=int(time.time()),
        served=served,
        principal=principal,
        prompts=(prompt,),
        requests=(request,),
        n=req.n,
        stream=req.stream,
        include_usage=req.include_usage,
        logprobs=top,
        prefix_changes=changes,
        route=info,
        turn=_turn(served, req, prompt),
        echo_text=_echo_text(req, messages),
        prompt_logprobs=_chat_prompt_logprobs(req),
        return_token_ids=bool(req.return_token_ids),
        continuous_usage=req.continuous_usage,
    )
    return job


async def count_chat(
    req: ChatCompletionRequest,
    registry: ModelRegistry,
    principal: Principal,
    limits: LimitSettings,
    routing: Routing = NO_ROUTING,
) -> int:
    """The prompt tokens `prepare_chat` would count for this request (and the quota charge),
    with nothing run: rendered and normalized the same way, by the first model it may use."""
    candidates = _candidates(registry, routing, req.model, principal)
    _at_most(len(req.messages), limits.max_messages, "messages", "messages")
    _at_most(len(req.tools or ()), limits.max_tools, "tools", "tools")
    _tools_checked(req)
    messages, sources = _messages_for_template(req.messages)
    first = images.seeing(candidates, sources, req.model)[0]
    read = await images.read(first, sources)
    prompt, _ = await _render_for(first, messages, req, _prefix_policy(first, principal))
    return len(images.placed(first, prompt, read))


def _prefix_policy(served: ServedModel, principal: Principal) -> prefix.PrefixPolicy | None:
    """The model's normalization settings, unless the key turns normalization off (or on)."""
    cfg = served.settings.prefix
    wanted = principal.limits.normalize_prompts
    if not (cfg.normalize if wanted is None else wanted):
        return None
    return prefix.PrefixPolicy(
        merge_system=cfg.merge_system,
        canonical_tools=cfg.canonical_tools,
        move_volatile=cfg.move_volatile,
        volatile_patterns=cfg.volatile_patterns or prefix.DEFAULT_VOLATILE_PATTERNS,
        stable_history=cfg.stable_history,
    )


def _render(
    served: ServedModel,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any] | None,
    policy: prefix.PrefixPolicy | None,
    generation: tuple[bool, bool] = (True, False),
) -> tuple[tokens.Prompt, tuple[str, ...]]:
    changes: tuple[str, ...] = ("off",)
    if policy is not None:
        hp = history_prefix(served.tokenizer, template_kwargs) if policy.stable_history else ""
        norm = prefix.normalize(messages, tools, policy, history_prefix=hp)
        messages, tools, changes = norm.messages, norm.tools, norm.changes
    add_generation_prompt, continue_final = generation
    prompt = tokens.render_chat(
        served.tokenizer,
        messages,
        tools=tools,
        template_kwargs=template_kwargs,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final,
    )
    return prompt, changes


def _cache_salt(served: ServedModel, principal: Principal) -> str | None:
    """A separate prefix cache per team (or user), when the model isolates tenants."""
    isolation = served.settings.prefix.cache_isolation
    if isolation == "team" and principal.team is not None:
        return f"team:{principal.team}"
    if isolation in ("team", "user"):
        return f"user:{principal.name}"
    return None


async def _completion_prompts(served: ServedModel, given: list[str | list[int]]) -> list[tokens.Prompt]:
    vocab_size = len(served.tokenizer)
    prompts = []
    for p in given:
        if isinstance(p, str):
            if len(p) <= INLINE_CHARS:
                prompts.append(tokens.encode_text(served.tokenizer, p))
            else:
                prompts.append(await asyncio.to_thread(tokens.encode_text, served.tokenizer, p))
        else:
            # Ids are >= 0 already (the schema's TokenId): one pass in C, not two, over a 32K-id prompt.
            if p and max(p) >= vocab_size:
                raise InvalidRequest(
                    f"Invalid 'prompt': token ids must be of this model's vocabulary (0..{vocab_size - 1}).",
                    param="prompt",
                )
            prompts.append(tokens.from_ids(p))
    if any(len(p) == 0 for p in prompts):
        raise InvalidRequest("Prompt must not be empty.", param="prompt")
    return prompts


async def prepare_completion(
    req: CompletionRequest,
    registry: ModelRegistry,
    principal: Principal,
    limits: LimitSettings,
    routing: Routing = NO_ROUTING,
) -> Job:
    candidates = _candidates(registry, routing, req.model, principal)
    _check_common(req, limits)
    given = req.prompts  # a property that walks every id: once
    _at_most(len(given), limits.max_messages, "prompts", "prompt")
    first = candidates[0]
    prompts = await _completion_prompts(first, given)
    longest = max(prompts, key=len)  # a multi-prompt request is routed by its longest prompt
    served, info = _route(routing, req.model, candidates, principal, longest, req.max_tokens)
    if served.tokenizer_id != first.tokenizer_id:
        prompts = await _completion_prompts(served, given)
    # A completion carries no image: its text or ids may not hold the image token either.
    prompts = [_truncated(served, principal, images.placed(served, p, (), "prompt"), req) for p in prompts]
    _check_vocabulary(req, served)
    job_id = f"cmpl-{uuid.uuid4().hex}"
    lp = req.logprobs
    # The prompt's logprobs: as asked, or for an echo with logprobs (the echoed tokens' own).
    prompt_lp = req.prompt_logprobs if req.prompt_logprobs is not None else (lp if req.echo else None)
    requests = tuple(
        EngineRequest(
            request_id=f"{job_id}-{i}",
            prompt_token_ids=p.token_ids,
            sampling=_sampling(
                req,
                max_tokens=_budget(served, principal, p, req.max_tokens, "prompt"),
                logprobs=lp,
                prompt_logprobs=prompt_lp,
            ),
            cache_salt=_cache_salt(served, principal),
        )
        for i, p in enumerate(prompts)
    )
    # One check: every prompt carries the same constraint.
    await _engine_checked(served, requests[0], _constraint_param(req))
    job = Job(
        kind="completion",
        id=job_id,
        created=int(time.time()),
        served=served,
        principal=principal,
        prompts=tuple(prompts),
        requests=requests,
        n=req.n,
        stream=req.stream,
        include_usage=req.include_usage,
        logprobs=lp,
        echo=req.echo,
        route=info,
        prompt_logprobs=prompt_lp,
        return_token_ids=bool(req.return_token_ids),
        continuous_usage=req.continuous_usage,
    )
    return job


def priority_of(principal: Principal, header: str | None) -> int:
    """The admission class: the key's default, or a less urgent one the request asks for."""
    floor = PRIORITY_CLASSES.index(principal.priority)
    if header is None:
        return floor
    name = header.strip().lower()
    if name not in PRIORITY_CLASSES:
        raise InvalidRequest(
            f"Unknown priority class {header!r}; use one of: {', '.join(PRIORITY_CLASSES)}.", code="invalid_priority"
        )
    return max(floor, PRIORITY_CLASSES.index(name))  # a header cannot raise a key above its class


def demand(job: Job, *, priority: int, user_max_running: int | None) -> Demand:
    """The job's worst-case claim on its engine's KV pool and running slots.

    Only the first prompt's blocks are offered for sharing: a multi-prompt
    completion's later prompts are charged in full (safe, rarely used).
    """
    spec = job.served.engine.kv_spec
    private = 0
    shared: tuple[Any, ...] = ()
    for i, (prompt, request) in enumerate(zip(job.prompts, job.requests, strict=True)):
        fp = kv.footprint(
            spec,
            prompt.cache_keys(),
            request.sampling.max_tokens,
            n=job.n,
            cache_salt=request.cache_salt,
            reads_cache=request.sampling.prompt_logprobs is None,  # vLLM skips the cache for these
        )
        if i == 0:
            shared = fp.shared_keys
            private += fp.private_blocks
        else:
            private += fp.blocks
    return Demand(
        id=job.id,
        pool=job.served.name,
        user=job.principal.name,
        priority=priority,
        sequences=len(job.requests) * job.n,
        private_blocks=private,
        shared_keys=shared,
        resume_at_end_only=kv.resumes_at_end(spec),
        tokens=job.worst_case_tokens,
        user_max_running=user_max_running,
        max_output=max(r.sampling.max_tokens for r in job.requests),
    )
