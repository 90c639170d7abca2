"""``specrt serve``: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over a :class:`~specrt.scheduler.Scheduler`.

Endpoints:

- ``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's request and response schemas, streaming with
  server-sent events (``stream: true``; ``stream_options.include_usage`` adds a last chunk with ``usage``, vLLM's
  ``continuous_usage_stats`` puts each choice's usage so far in every chunk), ``usage`` counts, ``logprobs`` (the
  chosen tokens' log-probabilities under the target and alternatives, all from the target's verification row of each
  position: completions ``logprobs: 0..5``, with ``echo`` the prompt's too from the prefill pass; chat ``logprobs:
  true`` with ``top_logprobs: 0..20``), and an extra ``speculative``
  field: acceptance rate, mean tokens per round, drafted / accepted / recovered / bonus tokens. A completions
  ``prompt`` is a string, a list of strings, a list of token ids or a list of token-id lists; ``n`` samples per prompt
  (choice i gets the seed ``seed + i``, or a random seed + i); choices are indexed prompt-major (prompt k's sample i is
  choice ``k * n + i``) and all of them are queued at once, so a batching decoder runs them in shared rounds. Chat
  messages, ``tools`` and tool calls go to the model's chat template. Structured output: ``response_format``
  (json_object / json_schema), vLLM's ``guided_*`` and ``structured_outputs``, and ``tool_choice`` required / auto /
  a named function (the answer constrained to ``<tool_call>`` calls and returned as ``message.tool_calls`` or streamed
  ``delta.tool_calls``; :mod:`specrt.toolcalls`). specrt's own settings are extra fields:
  ``top_k``, ``min_p``, ``repetition_penalty``, ``num_speculative_tokens`` (int or ``"auto"``), ``ignore_eos``,
  ``coupled``; so are vLLM's ``stop_token_ids``, ``include_stop_str_in_output``, ``skip_special_tokens``,
  ``add_special_tokens``, ``truncate_prompt_tokens``, ``add_generation_prompt``, ``continue_final_message``,
  ``request_id``, ``return_tokens_as_token_ids``. docs/openai-api.md is the field policy: every field is implemented,
  accepted because it cannot change the output, or refused with a 400 naming it; unknown fields are refused.
- vLLM's ``POST /tokenize``, ``POST /detokenize`` and ``GET /tokenizer_info``.
- ``GET /v1/models``, ``GET /v1/models/{model}``, ``GET /health``, ``GET /metrics`` (Prometheus text format: requests,
  tokens, acceptance rate, queue length, running requests, time to first token, inter-token latency, request latency,
  decode tokens/s), ``GET /openapi.json`` (the request and response schemas, every status, the streams' content type).

Errors follow OpenAI's schema ``{"error": {"message", "type", "param", "code"}}``: a malformed request gets 400 naming
the field (``param``), an unknown model 404, a wrong method 405 (with ``Allow``), a full queue 429 and a server
shutting down 503 (both with ``Retry-After``), a request past its timeout 504 (or, once streaming has begun, a last
``error`` event). A streamed response's status is sent once the request has started, so settings the engine refuses
are 400s too. A client that disconnects cancels its request (it stops after the current round); shutdown stops
accepting connections and finishes the admitted requests.

Requests run first come first served: one at a time, or with ``specrt serve --max-batch N`` (a ``Decoder(max_batch=N)``)
up to N together in batched rounds (continuous batching; each request gets the tokens it would get alone).
"""

import asyncio
import contextlib
import inspect
import json
import math
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from specrt import _specrt
from specrt.errors import ConfigError, GenerationCancelled, SequenceLengthError, SpecrtError, VocabError
from specrt.generate import Decoder, GenerationResult, StreamChunk, check_request
from specrt.scheduler import (
    DEFAULT_MAX_QUEUE,
    QueueFullError,
    RequestHandle,
    RequestTimeoutError,
    Scheduler,
    SchedulerClosedError,
)
from specrt.toolcalls import ToolCallParser

__all__ = ["create_app", "run_server"]

_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "grammar": "stop"}

#: Most stop strings a request may give (OpenAI allows 4, vLLM sets no limit; lm-eval sends its ``until`` strings and
#: EOS): each round searches the new text for each of them.
_MAX_STOPS = 256

#: Retry-After seconds of a 429 (the queue is full: a slot frees when a request ends) and a 503 (shutting down: this
#: process will not come back, a restarted one or another replica may).
_RETRY_AFTER_S = {429: 1, 503: 10}

_STRUCTURAL_TAG = (
    "vLLM's structural tags (free text with tagged, schema-constrained regions) are not translated yet; use tools with "
    'tool_choice "auto", or guided_grammar / structured_outputs.grammar (llguidance Lark, which inlines %json schemas)'
)

#: vLLM's ``guided_*`` fields -> the Decoder's constraint arguments (docs/openai-api.md).
_GUIDED = {
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
#: vLLM's ``structured_outputs`` keys -> the Decoder's constraint arguments (``json_object`` true -> response_format).
_STRUCTURED_OUTPUTS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}

#: Fields refused unless they hold a value that leaves the output as it is, because ignoring them would change the
#: output (docs/openai-api.md): field -> (accepted(value), the accepted values, why the others are refused). Fields a
#: request type lacks are skipped.
_REFUSED_UNLESS: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "logit_bias": (lambda v: not v, "null or {}", "biasing logits is not implemented yet"),
    "spaces_between_special_tokens": (lambda v: v, "true", "special tokens are decoded without added spaces"),
    "priority": (lambda v: v == 0, "0", "requests run first come first served"),
    "use_beam_search": (lambda v: not v, "false", "beam search is not implemented"),
    "allowed_token_ids": (lambda v: v is None, "null", "restricting the vocabulary is not implemented yet"),
    "bad_words": (lambda v: not v, "null or []", "banning words is not implemented yet"),
    "logits_processors": (lambda v: not v, "null or []", "custom logits processors are not supported"),
    "prompt_logprobs": (
        lambda v: v is None,
        "null",
        "the server does not return prompt log-probabilities yet",
    ),
    "structural_tag": (lambda v: v is None, "null", _STRUCTURAL_TAG),
    "guided_whitespace_pattern": (lambda v: v is None, "null", 'JSON is always compact (", " and ": ")'),
    "kv_transfer_params": (lambda v: v is None, "null", "disaggregated serving is not supported"),
    "vllm_xargs": (lambda v: not v, "null or {}", "no custom extensions are installed"),
    "suffix": (lambda v: not v, 'null or ""', "insertion (text after the completion) is not implemented"),
    "prompt_embeds": (lambda v: v is None, "null", "prompts are text or token ids"),
    "modalities": (lambda v: v is None or v == ["text"], '["text"] or null', "specrt generates text only"),
    "audio": (lambda v: v is None, "null", "specrt generates text only"),
    "web_search_options": (lambda v: v is None, "null", "specrt has no web search"),
    "moderation": (lambda v: v is None, "null", "specrt runs no moderation model"),
    "reasoning_effort": (lambda v: v is None, "null", "the served models take no reasoning effort"),
    "verbosity": (lambda v: v is None, "null", "the served models take no verbosity setting"),
    "chat_template": (lambda v: v is None, "null", "the model folder's chat template is the only one"),
    "mm_processor_kwargs": (lambda v: not v, "null or {}", "specrt serves text-only models"),
    "include_reasoning": (lambda v: v, "true", "reasoning text is not separated from the answer"),
}

#: Fields refused per request type where the same name means different things (chat ``echo`` is vLLM's "prepend the
#: last message", completions' ``echo`` prepends the prompt and is implemented).
_REFUSED_UNLESS_CHAT = {
    "echo": (lambda v: not v, "false", "prepending the last message is not implemented"),
}


def _shown(value: Any) -> str:
    """A request value as JSON text (pydantic models as their dict), for error messages."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(exclude_none=True)
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def _check_policy(req: Any, chat: bool) -> None:
    """Refuse the fields that would change the output if they were ignored (``_BadFieldError`` naming the field,
    its value and the accepted values); cross-field rules OpenAI and vLLM also enforce."""
    table = {**_REFUSED_UNLESS, **(_REFUSED_UNLESS_CHAT if chat else {})}
    for name, (accepted, allowed, why) in table.items():
        if name not in type(req).model_fields:
            continue
        value = getattr(req, name)
        if not accepted(value):
            raise _BadFieldError(
                name, f"{name} {_shown(value)} is not supported: {why} (accepted: {allowed}; docs/openai-api.md)"
            )
    best_of = getattr(req, "best_of", None)
    if best_of is not None and best_of != req.n:
        why = (
            "must be >= n"
            if best_of < req.n
            else "ranking best_of samples by log-probability is not implemented (accepted: best_of == n or null)"
        )
        raise _BadFieldError("best_of", f"best_of {best_of} with n {req.n}: {why}")
    if getattr(req, "continue_final_message", False) and req.add_generation_prompt:
        raise _BadFieldError(
            "continue_final_message",
            "continue_final_message true needs add_generation_prompt false (the final message is continued, no new "
            "one is started)",
        )


def _constraint_fields(req: Any) -> list[tuple[str, str, Any]]:
    """The structured-output fields a request sets, as (request field, Decoder argument, value): OpenAI's
    ``response_format`` (not ``text``), vLLM's ``guided_*`` and ``structured_outputs`` keys, and ``tools`` with
    ``tool_choice`` ``"required"``, ``"auto"`` or a named function (a tool-call grammar, :mod:`specrt.toolcalls`).
    The values are passed on as they are: the Rust resolver checks them (one definition)."""
    from specrt.toolcalls import ToolsError, check_tools, tool_call_grammar

    found: list[tuple[str, str, Any]] = []
    rf = getattr(req, "response_format", None)
    if rf is not None and rf.type != "text":
        found.append(("response_format", "response_format", rf.model_dump(exclude_none=True)))
    for name, arg in _GUIDED.items():
        value = getattr(req, name, None)
        if value is not None:
            found.append((name, arg, value))
    for key, value in (getattr(req, "structured_outputs", None) or {}).items():
        where = f"structured_outputs.{key}"
        if value is None:
            continue
        if key == "json_object":
            if value is not True:
                raise _BadFieldError(where, f"{where} {_shown(value)} is invalid (accepted: true or null)")
            found.append((where, "response_format", {"type": "json_object"}))
        elif key in _STRUCTURED_OUTPUTS:
            found.append((where, _STRUCTURED_OUTPUTS[key], value))
        else:
            why = _STRUCTURAL_TAG if key == "structural_tag" else "not a structured-output key specrt takes"
            raise _BadFieldError(
                where,
                f"{where} is not supported: {why} (accepted keys: {', '.join([*_STRUCTURED_OUTPUTS, 'json_object'])})",
            )
    choice = getattr(req, "tool_choice", None)
    tools = getattr(req, "tools", None)
    if tools:
        try:
            check_tools([t.function.model_dump(exclude_none=True) for t in tools])
        except ToolsError as e:
            raise _BadFieldError(e.param, str(e)) from None
    if choice is not None and choice != "none":
        if not tools:
            raise _BadFieldError("tool_choice", f"tool_choice {_shown(choice)} needs tools (the request has none)")
        functions = [t.function.model_dump(exclude_none=True) for t in tools]
        if isinstance(choice, str):
            multiple = req.parallel_tool_calls is not False
            grammar = tool_call_grammar(functions, multiple=multiple, text_allowed=choice == "auto")
        else:
            named = [f for f in functions if f["name"] == choice.function.name]
            if not named:
                raise _BadFieldError(
                    "tool_choice",
                    f"tool_choice names the function {choice.function.name!r}, which is not among the tools "
                    f"(accepted: {', '.join(repr(f['name']) for f in functions)})",
                )
            grammar = tool_call_grammar(named[:1], multiple=False)
        found.append(("tool_choice", "grammar", grammar))
    if len(found) > 1:
        raise _BadFieldError(
            found[1][0],
            f"{found[1][0]}: structured output takes one constraint per request: response_format (json_object / "
            "json_schema), a guided_* field, a structured_outputs key, or tool_choice (required / auto / a function); "
            "got " + " and ".join(f for f, _, _ in found),
        )
    return found


def _pydantic_models() -> dict[str, Any]:
    """The request schemas, and the response schemas ``/openapi.json`` documents (built on first use: pydantic is an
    optional dependency, ``specrt[serve]``). docs/openai-api.md says what each request field does."""
    from typing import Annotated

    from pydantic import BaseModel, ConfigDict, Field

    class _Strict(BaseModel):
        # strict: "5" is not an int, true is not 1, 1.0 is not a token id; no NaN / Infinity.
        model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    class StreamOptions(_Strict):
        include_usage: bool = False
        continuous_usage_stats: bool = False  # vLLM: usage in every chunk
        include_obfuscation: bool = False  # accepted; no obfuscation padding is added

    class ResponseFormat(_Strict):
        type: Literal["text", "json_object", "json_schema"]
        json_schema: dict[str, Any] | None = None

    class Sampling(_Strict):
        model: str | None = None
        max_tokens: int | None = Field(default=None, ge=1)
        temperature: float | None = Field(default=None, ge=0.0, le=2.0)
        # Ranges checked by the Rust resolver when the request is submitted (a 400 naming the field).
        top_p: float | None = None
        top_k: int | None = None
        min_p: float | None = None
        repetition_penalty: float | None = None
        frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
        presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
        seed: int | None = None  # 0 <= seed < 2**64, checked by the Rust resolver (_submit_all)
        stop: str | Annotated[list[str], Field(max_length=_MAX_STOPS)] | None = None
        n: int = Field(default=1, ge=1, le=128)
        stream: bool = False
        stream_options: StreamOptions | None = None
        # Accepted; they cannot change the output.
        user: str | None = None
        metadata: dict[str, str] | None = None
        store: bool | None = None
        service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
        safety_identifier: str | None = None
        prompt_cache_key: str | None = None
        prompt_cache_options: dict[str, Any] | None = None
        prompt_cache_retention: Literal["in_memory", "24h"] | None = None
        cache_salt: str | None = None
        length_penalty: float = 1.0  # vLLM: beam search only
        guided_decoding_backend: str | None = None  # vLLM: always llguidance here
        # specrt's settings.
        num_speculative_tokens: Annotated[int, Field(ge=0, le=_specrt.MAX_DRAFT_TOKENS)] | Literal["auto"] | None = None
        ignore_eos: bool = False
        coupled: bool = False
        # vLLM's extensions, implemented.
        stop_token_ids: list[int] | None = None
        include_stop_str_in_output: bool = False
        skip_special_tokens: bool = True
        add_special_tokens: bool | None = None
        truncate_prompt_tokens: int | None = Field(default=None, ge=1)
        request_id: str | None = None
        return_tokens_as_token_ids: bool = False
        # Refused unless at the value that leaves the output as it is (_REFUSED_UNLESS).
        logit_bias: dict[str, float] | None = None
        response_format: ResponseFormat | None = None
        min_tokens: int = Field(default=0, ge=0)
        spaces_between_special_tokens: bool = True
        priority: int = 0
        use_beam_search: bool = False
        allowed_token_ids: list[int] | None = None
        bad_words: list[str] | None = None
        logits_processors: list[Any] | None = None
        prompt_logprobs: int | None = None
        guided_whitespace_pattern: str | None = None
        guided_json: str | dict[str, Any] | None = None
        guided_regex: str | None = None
        guided_choice: list[str] | None = None
        guided_grammar: str | None = None
        structural_tag: str | None = None
        structured_outputs: dict[str, Any] | None = None
        kv_transfer_params: dict[str, Any] | None = None
        vllm_xargs: dict[str, Any] | None = None

    class CompletionRequest(Sampling):
        prompt: str | list[str] | list[int] | list[list[int]]
        # 0 scores the prompt only (with echo, not streamed): OpenAI's and lm-eval's scoring request.
        max_tokens: int | None = Field(default=None, ge=0)
        logprobs: int | None = Field(default=None, ge=0, le=5)
        echo: bool = False
        best_of: int | None = Field(default=None, ge=1, le=128)
        suffix: str | None = None
        prompt_embeds: str | list[str] | None = None

    class FunctionCall(_Strict):
        name: str
        arguments: str

    class ToolCall(_Strict):
        id: str
        type: Literal["function"] = "function"
        function: FunctionCall

    class ChatMessage(_Strict):
        role: Literal["system", "user", "assistant", "developer", "tool"]
        # None: an assistant message that only calls tools (refused for the other roles).
        content: str | list[dict[str, Any]] | None = None
        name: str | None = None
        tool_calls: list[ToolCall] | None = None
        tool_call_id: str | None = None
        # An assistant turn's other OpenAI fields: accepted as null only (the template has no place for them).
        refusal: str | None = None
        audio: dict[str, Any] | None = None
        function_call: dict[str, Any] | None = None

    class FunctionDefinition(_Strict):
        name: str
        description: str | None = None
        parameters: dict[str, Any] | None = None
        strict: bool | None = None

    class ChatTool(_Strict):
        type: Literal["function"]
        function: FunctionDefinition

    class NamedFunction(_Strict):
        name: str

    class NamedToolChoice(_Strict):
        type: Literal["function"]
        function: NamedFunction

    class Prediction(_Strict):
        type: Literal["content"]
        content: str | list[dict[str, Any]]

    class ChatTemplating(_Strict):
        """How messages become the prompt (shared by chat completions and ``/tokenize``)."""

        messages: list[ChatMessage] = Field(min_length=1)
        tools: list[ChatTool] | None = None
        add_generation_prompt: bool = True
        continue_final_message: bool = False
        chat_template: str | None = None
        chat_template_kwargs: dict[str, Any] | None = None
        documents: list[dict[str, Any]] | None = None
        mm_processor_kwargs: dict[str, Any] | None = None

    class ChatCompletionRequest(ChatTemplating, Sampling):
        max_completion_tokens: int | None = Field(default=None, ge=1)
        logprobs: bool = False
        top_logprobs: int | None = Field(default=None, ge=0, le=_specrt.MAX_TOP_LOGPROBS)
        tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
        parallel_tool_calls: bool | None = None
        prediction: Prediction | None = None
        modalities: list[Literal["text", "audio"]] | None = None
        audio: dict[str, Any] | None = None
        web_search_options: dict[str, Any] | None = None
        moderation: dict[str, Any] | None = None
        reasoning_effort: str | None = None
        verbosity: Literal["low", "medium", "high"] | None = None
        echo: bool = False
        include_reasoning: bool = True

    class TokenizeCompletionRequest(_Strict):
        model: str | None = None
        prompt: str
        add_special_tokens: bool = True
        return_token_strs: bool | None = False

    class TokenizeChatRequest(ChatTemplating):
        model: str | None = None
        add_special_tokens: bool = False
        return_token_strs: bool | None = False

    class DetokenizeRequest(_Strict):
        model: str | None = None
        tokens: list[int]

    # ----- responses (documented in /openapi.json; the handlers build plain dicts) ---------------------------------
    class ErrorDetail(BaseModel):
        message: str
        type: str
        param: str | None
        code: str | None

    class ErrorResponse(BaseModel):
        error: ErrorDetail

    class PromptTokensDetails(BaseModel):
        cached_tokens: int

    class Usage(BaseModel):
        prompt_tokens: int
        completion_tokens: int
        total_tokens: int
        prompt_tokens_details: PromptTokensDetails | None = None

    class Speculative(BaseModel):
        acceptance_rate: float | None
        mean_tokens_per_round: float | None
        n_rounds: int
        n_drafted: int
        n_accepted: int
        n_recovered: int
        n_bonus: int
        decode_tokens_per_s: float | None

    class CompletionLogprobs(BaseModel):
        tokens: list[str]
        token_logprobs: list[float | None]
        top_logprobs: list[dict[str, float] | None] | None
        text_offset: list[int]

    class CompletionChoice(BaseModel):
        index: int
        text: str
        logprobs: CompletionLogprobs | None
        finish_reason: Literal["stop", "length"] | None

    class CompletionResponse(BaseModel):
        id: str
        object: Literal["text_completion"]
        created: int
        model: str
        choices: list[CompletionChoice]
        usage: Usage
        speculative: Speculative

    class ChatTokenLogprob(BaseModel):
        token: str
        logprob: float
        bytes: list[int]
        top_logprobs: list[Any]

    class ChatLogprobs(BaseModel):
        content: list[ChatTokenLogprob]

    class AssistantMessage(BaseModel):
        role: Literal["assistant"]
        content: str | None  # null when the answer is tool calls
        tool_calls: list[ToolCall] | None = None

    class ChatChoice(BaseModel):
        index: int
        message: AssistantMessage
        logprobs: ChatLogprobs | None
        finish_reason: Literal["stop", "length", "tool_calls"] | None

    class ChatCompletionResponse(BaseModel):
        id: str
        object: Literal["chat.completion"]
        created: int
        model: str
        choices: list[ChatChoice]
        usage: Usage
        speculative: Speculative

    class ModelCard(BaseModel):
        id: str
        object: Literal["model"]
        created: int
        owned_by: str
        max_model_len: int

    class ModelList(BaseModel):
        object: Literal["list"]
        data: list[ModelCard]

    class Health(BaseModel):
        status: Literal["ok"]
        queue_length: int
        running: int

    class TokenizeResponse(BaseModel):
        count: int
        max_model_len: int
        tokens: list[int]
        token_strs: list[str] | None

    class DetokenizeResponse(BaseModel):
        prompt: str

    class TokenizerInfoResponse(BaseModel):
        model_config = ConfigDict(extra="allow")
        tokenizer_class: str

    return {
        "completion": CompletionRequest,
        "chat": ChatCompletionRequest,
        "tokenize_completion": TokenizeCompletionRequest,
        "tokenize_chat": TokenizeChatRequest,
        "detokenize": DetokenizeRequest,
        "responses": [
            ErrorResponse,
            CompletionResponse,
            ChatCompletionResponse,
            ModelCard,
            ModelList,
            Health,
            TokenizeResponse,
            DetokenizeResponse,
            TokenizerInfoResponse,
        ],
    }


class _Metrics:
    """Prometheus metrics of one app (its own registry, so several apps in one process do not collide)."""

    def __init__(self, scheduler: Scheduler) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "specrt_requests", "Requests ended, by endpoint and outcome", ["endpoint", "outcome"], registry=r
        )
        self.prompt_tokens = Counter("specrt_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("specrt_generation_tokens", "Tokens generated (finished requests)", registry=r)
        self.drafted = Counter("specrt_draft_tokens", "Draft tokens proposed and verified", registry=r)
        self.accepted = Counter("specrt_accepted_tokens", "Draft tokens the target accepted", registry=r)
        # Structured output (docs/structured-output.md): mask time per token = constraint_seconds / constrained tokens.
        self.forced = Counter(
            "specrt_forced_draft_tokens",
            "Grammar-forced tokens proposed without a draft pass (counted in specrt_draft_tokens too)",
            registry=r,
        )
        self.constraint_seconds = Counter(
            "specrt_constraint_seconds",
            "Time in output constraints: masks, forced tokens, advancing the matcher (finished requests)",
            registry=r,
        )
        self.constrained_tokens = Counter(
            "specrt_constrained_generation_tokens",
            "Tokens generated by requests whose output constraint did work (finished requests)",
            registry=r,
        )
        # vLLM's prefix_cache_queries / prefix_cache_hits are in tokens; these count requests and reused tokens.
        self.prefix_cache = Counter(
            "specrt_prefix_cache_requests",
            "Finished requests by prefix-cache outcome (hit: the target reused a cached prompt prefix)",
            ["outcome"],
            registry=r,
        )
        self.cached_tokens = Counter(
            "specrt_prefix_cache_reused_tokens",
            "Prompt tokens whose target KV was reused (finished requests)",
            registry=r,
        )
        self.acceptance = Gauge(
            "specrt_acceptance_rate", "Accepted / drafted tokens since start (NaN until a token is drafted)", registry=r
        )
        # NaN, not 0, while nothing was drafted (a server without a draft, or before the first round): responses say
        # `null` there, and 0 would read as a draft that is always rejected.
        self.acceptance.set_function(lambda: self._accepted / self._drafted if self._drafted else math.nan)
        self.tokens_per_s = Gauge("specrt_decode_tokens_per_second", "Decode tokens/s of the last request", registry=r)
        self.mean_tokens_per_round = Gauge(
            "specrt_mean_tokens_per_round", "Emitted tokens / rounds of the last request", registry=r
        )
        queue = Gauge("specrt_queue_length", "Requests waiting to start", registry=r)
        queue.set_function(lambda: scheduler.queue_length)
        running = Gauge("specrt_running_requests", "Requests generating now", registry=r)
        running.set_function(lambda: scheduler.running)
        buckets = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
        self.ttft = Histogram(
            "specrt_time_to_first_token_seconds", "Submission to first token", buckets=buckets, registry=r
        )
        self.itl = Histogram(
            "specrt_inter_token_latency_seconds",
            "Time between tokens (a round's gap per token)",
            buckets=buckets,
            registry=r,
        )
        self.latency = Histogram("specrt_request_latency_seconds", "Submission to end", buckets=buckets, registry=r)
        self._drafted = 0
        self._accepted = 0

    def observe(self, endpoint: str, handle: RequestHandle, outcome: str, result: GenerationResult | None) -> None:
        self.requests.labels(endpoint, outcome).inc()
        if handle.finished_at is not None:
            self.latency.observe(handle.finished_at - handle.submitted_at)
        if handle.first_token_at is not None:
            self.ttft.observe(handle.first_token_at - handle.submitted_at)
        for (t0, _), (t1, n) in zip(handle.token_times, handle.token_times[1:], strict=False):
            gap = (t1 - t0) / n
            for _ in range(n):
                self.itl.observe(gap)
        if result is not None:
            s = result.stats
            self.prompt_tokens.inc(s.n_prompt_tokens)
            self.prefix_cache.labels("hit" if s.prefix_cache_hit else "miss").inc()
            self.cached_tokens.inc(s.n_cached_tokens)
            self.generation_tokens.inc(len(result.token_ids))
            self.drafted.inc(s.n_drafted)
            self.accepted.inc(s.n_accepted)
            self.forced.inc(s.n_drafted_forced)
            if s.mask_ms > 0:
                self.constraint_seconds.inc(s.mask_ms / 1000)
                self.constrained_tokens.inc(len(result.token_ids))
            self._drafted += s.n_drafted
            self._accepted += s.n_accepted
            if s.decode_tokens_per_s is not None:
                self.tokens_per_s.set(s.decode_tokens_per_s)
            if s.mean_tokens_per_round is not None:
                self.mean_tokens_per_round.set(s.mean_tokens_per_round)


def _error(
    status: int,
    message: str,
    type_: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Any:
    """An error response in OpenAI's schema; a 429 or 503 also says when to retry (``Retry-After``)."""
    from fastapi.responses import JSONResponse

    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    headers = dict(headers or {})
    if status in _RETRY_AFTER_S:
        headers.setdefault("Retry-After", str(_RETRY_AFTER_S[status]))
    return JSONResponse(body, status_code=status, headers=headers or None)


def _error_event(message: str, type_: str, code: str | None) -> str:
    return _sse({"error": {"message": message, "type": type_, "param": None, "code": code}})


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _speculative(results: list[GenerationResult]) -> dict[str, Any]:
    """The ``speculative`` field: one result's statistics, or for several choices the summed counts, the rates of
    the sums, and the mean of the choices' decode tokens/s."""
    stats = [r.stats for r in results]
    if len(stats) == 1:
        s = stats[0]
        return {
            "acceptance_rate": s.acceptance_rate,
            "mean_tokens_per_round": s.mean_tokens_per_round,
            "n_rounds": s.n_rounds,
            "n_drafted": s.n_drafted,
            "n_accepted": s.n_accepted,
            "n_recovered": s.n_recovered,
            "n_bonus": s.n_bonus,
            "decode_tokens_per_s": s.decode_tokens_per_s,
        }
    out: dict[str, Any] = {k: sum(getattr(s, k) for s in stats) for k in _SPEC_COUNTS}
    n_emitted = out["n_accepted"] + out["n_recovered"] + out["n_bonus"]
    rates = [s.decode_tokens_per_s for s in stats if s.decode_tokens_per_s is not None]
    return {
        "acceptance_rate": out["n_accepted"] / out["n_drafted"] if out["n_drafted"] else None,
        "mean_tokens_per_round": n_emitted / out["n_rounds"] if out["n_rounds"] else None,
        **out,
        "decode_tokens_per_s": sum(rates) / len(rates) if rates else None,
    }


_SPEC_COUNTS = ("n_rounds", "n_drafted", "n_accepted", "n_recovered", "n_bonus")


def _usage(n_prompt: int, n_out: int, n_cached: int | None = None) -> dict[str, Any]:
    """OpenAI's ``usage``; with ``n_cached`` (prompt tokens whose KV came from the prefix cache) also
    ``prompt_tokens_details.cached_tokens``, as OpenAI and vLLM report it."""
    usage: dict[str, Any] = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
    if n_cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": n_cached}
    return usage


@dataclass
class _Choice:
    """One generation of a request: prompt ``prompt_index``'s sample ``index % n``, choice ``index``."""

    index: int
    prompt_index: int
    handle: RequestHandle
    n_prompt: int
    echo: str = ""  # text put before the generated text (completions' echo)
    first: bool = True  # nothing sent yet
    chunks: Any = None  # the handle's async iterator (streaming)
    result: GenerationResult | None = None
    error: BaseException | None = None
    n_out: int = 0  # tokens streamed so far
    seen: list[int] = field(default_factory=list)  # tokens whose logprobs were given out (text offsets)
    prompt_chunk: StreamChunk | None = None  # the first chunk of a prompt-scored stream (echo with logprobs)
    score_only: bool = False  # max_tokens 0 with echo: the one token generated is not returned or counted
    tools: ToolCallParser | None = None  # chat with tool_choice required / a function / auto: tool calls parsed


def _whole_text(c: _Choice, result: GenerationResult) -> str:
    """The text of a finished choice that was not streamed: the driver's, as the request's skip_special_tokens /
    include_stop_str_in_output define it."""
    return result.text


async def _merged(choices: list[_Choice]) -> AsyncIterator[tuple[_Choice, StreamChunk]]:
    """The chunks of all ``choices`` as they come (each choice's in order); raises the first error of any."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(c: _Choice) -> None:
        try:
            async for chunk in c.chunks:
                await queue.put((c, chunk, None))
            await queue.put((c, None, None))
        except Exception as e:  # the request's error, raised to the stream below
            await queue.put((c, None, e))

    tasks = [asyncio.ensure_future(pump(c)) for c in choices]
    try:
        open_ = len(choices)
        while open_:
            c, chunk, error = await queue.get()
            if error is not None:
                c.error = error
                raise error
            if chunk is None:
                open_ -= 1
                continue
            yield c, chunk
    finally:
        for t in tasks:
            t.cancel()


def _gpt2_byte_decoder() -> dict[str, int]:
    """Byte-level BPE (GPT-2, Qwen, SmolLM2) spells byte b as one printable character; this maps it back."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


_BYTE_DECODER = _gpt2_byte_decoder()

#: specrt's setting names (a ``ConfigError``'s ``field``) -> the request fields that set them, where the names differ;
#: every other setting has its request field's name. ``max_new_tokens`` is ``max_completion_tokens`` when a chat
#: request used that, and ``prompt`` (the token ids) is a chat request's ``messages`` (see ``_param_of``).
_REQUEST_FIELDS = {
    "max_new_tokens": "max_tokens",
    "kwargs": "chat_template_kwargs",  # the chat template's keyword arguments
}

#: The Decoder's constraint arguments (the values of ``_GUIDED`` and ``_STRUCTURED_OUTPUTS``) and the kinds their
#: errors name: a refusal of one of them is about the request field that carried the constraint.
_CONSTRAINT_SETTINGS = {"response_format", "json_schema", "json_object", "regex", "grammar", "choice"}


def _param_of(error: BaseException, req: Any = None) -> str | None:
    """The request field a refused setting is about (OpenAI's ``param``): the ``field`` of a ``ConfigError`` from the
    Rust validators, in the request's words (None: the error names no setting)."""
    field = getattr(error, "field", None)
    if not isinstance(field, str):
        return None
    if field == "max_new_tokens" and getattr(req, "max_completion_tokens", None):
        return "max_completion_tokens"
    if field == "prompt" and hasattr(req, "messages"):
        return "messages"
    return _REQUEST_FIELDS.get(field, field)


def _continue_final(text: str, final: str) -> str:
    """``text`` (a rendered chat) cut right after the final message's content, so the model continues it
    (transformers' ``continue_final_message``; templates that strip the content are matched stripped)."""
    if not final:
        return text
    for f in (final, final.strip()):
        if f and f in text:
            return text[: text.rindex(f) + len(f)]
    raise _BadFieldError(
        "continue_final_message",
        "continue_final_message: the final message's content does not appear in the rendered chat, so it cannot be "
        "continued",
    )


def _tokenizer_config(decoder: Any) -> dict[str, Any]:
    """``/tokenizer_info``: the target folder's ``tokenizer_config.json``, or for a folder converted before specrt
    wrote one, the same built from ``specrt_config.json`` and ``chat_template.jinja``."""
    from pathlib import Path

    folder = Path(decoder.target_path)
    path = folder / "tokenizer_config.json"
    if path.is_file():
        config = json.loads(path.read_text(encoding="utf-8"))
    else:
        from specrt.convert.tokenizer import hf_tokenizer_config

        spec_path = folder / "specrt_config.json"
        spec = json.loads(spec_path.read_text(encoding="utf-8")) if spec_path.is_file() else {}
        template = folder / "chat_template.jinja"
        config = hf_tokenizer_config(
            decoder.tokenizer,
            bos_token_id=spec.get("bos_token_id"),
            eos_token_ids=list(decoder.eos_token_ids) or list(spec.get("eos_token_ids") or []),
            pad_token_id=spec.get("pad_token_id"),
            chat_template=template.read_text(encoding="utf-8") if template.is_file() else None,
            model_max_length=int(spec.get("max_position_embeddings", decoder.max_seq_len)),
        )
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    return config


# ----- /openapi.json ---------------------------------------------------------------------------------------------
_REQUEST_MODELS = ("completion", "chat", "tokenize_completion", "tokenize_chat", "detokenize")

_STATUS_TEXT = {
    400: "A malformed request, or a field specrt refuses (docs/openai-api.md); `param` names the field",
    404: "Another model than the one served",
    429: "The queue is full",
    499: "The client went away before the result",
    500: "An internal error",
    503: "The server is shutting down",
    504: "The request ran past the server's request timeout",
}


def _openapi_components(schemas: dict[str, Any]) -> dict[str, Any]:
    """JSON schemas of the request models (as validated) and the response models (as sent), by name, for
    ``#/components/schemas``."""
    from pydantic.json_schema import models_json_schema

    models = [(schemas[k], "validation") for k in _REQUEST_MODELS]
    models += [(m, "serialization") for m in schemas["responses"]]
    _, top = models_json_schema(models, ref_template="#/components/schemas/{model}")
    return top.get("$defs", {})


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _body(*names: str) -> dict[str, Any]:
    """An operation's ``openapi_extra``: a JSON request body of one of the named schemas."""
    schema = _ref(names[0]) if len(names) == 1 else {"oneOf": [_ref(n) for n in names]}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def _generation_ok(name: str) -> dict[str, Any]:
    """200 of a generation endpoint: the whole response as JSON, or with ``stream: true`` server-sent events."""
    ok = _json(name, "The completion (JSON), or with stream: true its chunks as server-sent events")
    # One server-sent event (OpenAPI before 3.2: ``schema`` describes each event of a stream): its ``data`` holds a
    # chunk as JSON, or ``[DONE]``.
    event = {
        "type": "object",
        "properties": {
            "data": {"type": "string"},
            "event": {"type": "string"},
            "id": {"type": "string"},
            "retry": {"type": "integer"},
        },
        "required": ["data"],
    }
    ok["content"]["text/event-stream"] = {"schema": event}
    return ok


def _responses(ok: dict[str, Any], *statuses: int) -> dict[int | str, dict[str, Any]]:
    """An operation's documented responses: ``ok`` (200) and the error statuses, in OpenAI's error schema (with
    ``Retry-After`` where it is sent)."""
    out: dict[int | str, dict[str, Any]] = {200: ok}
    for status in statuses:
        response = _json("ErrorResponse", _STATUS_TEXT[status])
        if status in _RETRY_AFTER_S:
            response["headers"] = {
                "Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "string"}}
            }
        out[status] = response
    return out


def create_app(
    decoder: Decoder,
    *,
    model_name: str,
    max_queue: int = DEFAULT_MAX_QUEUE,
    request_timeout_s: float | None = 600.0,
    num_speculative_tokens: int | str = "auto",
    default_max_tokens: int = 256,
) -> Any:
    """The FastAPI app serving ``decoder`` as ``model_name``.

    Args:
        decoder: the loaded :class:`~specrt.Decoder` (the app's scheduler becomes its only user).
        model_name: the id ``/v1/models`` lists and requests' ``model`` must name (or omit).
        max_queue: generations that may wait (a request queues one per choice: prompts x n); a request whose
            choices do not all fit now gets 429, one with more choices than ``max_queue`` a 400.
        request_timeout_s: seconds from arrival after which a request ends (504 / an error event); None = no limit.
        num_speculative_tokens: K of requests that do not set it (an int 0..64 or ``"auto"``).
        default_max_tokens: ``max_tokens`` of chat requests that set neither it nor ``max_completion_tokens``
            (completions default to OpenAI's 16).

    Raises:
        ImportError: fastapi / prometheus_client are not installed (``pip install 'specrt[serve]'``).
        ConfigError: ``max_queue`` < 1 or ``request_timeout_s`` <= 0.
    """
    from fastapi import FastAPI, Request
    from fastapi.openapi.utils import get_openapi
    from fastapi.responses import PlainTextResponse, StreamingResponse
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.exceptions import HTTPException as StarletteHTTPException

    schemas = _pydantic_models()
    scheduler = Scheduler(decoder, max_queue=max_queue, default_timeout_s=request_timeout_s)
    metrics = _Metrics(scheduler)
    tokenizer = decoder.tokenizer
    state: dict[str, Any] = {"draining": False, "tokenizer_info": None}
    components = _openapi_components(schemas)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        # Shutdown: refuse new requests, finish the admitted ones.
        state["draining"] = True
        await asyncio.to_thread(scheduler.close, True)

    app = FastAPI(title="specrt", version=_version(), lifespan=lifespan)
    app.state.scheduler = scheduler
    app.state.metrics = metrics

    def openapi() -> dict[str, Any]:
        # The routes read the raw body (to answer a bad one with OpenAI's 400 naming the field), so FastAPI does not
        # see the request models: their schemas join the components the operations' requestBody refers to.
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(components)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> Any:
        # 404 for unknown paths, 405 for a wrong method: OpenAI's error schema, not FastAPI's {"detail": ...}; the
        # exception's headers (a 405's Allow) are kept.
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _error(exc.status_code, str(exc.detail), kind, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal_error(_request: Request, exc: Exception) -> Any:
        return _error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")

    def _unavailable() -> Any:
        return _error(503, "the server is shutting down", "server_error", code="shutting_down")

    def _model_not_found(model: str) -> Any:
        return _error(
            404,
            f"the model {model!r} does not exist (this server has {model_name!r})",
            "invalid_request_error",
            "model",
            "model_not_found",
        )

    def _card() -> dict[str, Any]:
        return {
            "id": model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "specrt",
            "max_model_len": decoder.max_seq_len,
        }

    @app.get("/health", responses=_responses(_json("Health", "The server is up"), 503))
    async def health() -> Any:
        if state["draining"]:
            return _unavailable()
        return {"status": "ok", "queue_length": scheduler.queue_length, "running": scheduler.running}

    @app.get("/v1/models", responses=_responses(_json("ModelList", "The served model")))
    async def models() -> Any:
        return {"object": "list", "data": [_card()]}

    @app.get("/v1/models/{model:path}", responses=_responses(_json("ModelCard", "The model"), 404))
    async def model(model: str) -> Any:
        return _card() if model == model_name else _model_not_found(model)

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": {}}}}},
    )
    async def prometheus() -> Any:
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def _kwargs(req: Any, max_tokens: int) -> dict[str, Any]:
        """The Decoder settings of a request, all but the seed (each choice has its own)."""
        kw: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "num_speculative_tokens": (
                num_speculative_tokens if req.num_speculative_tokens is None else req.num_speculative_tokens
            ),
            "frequency_penalty": req.frequency_penalty,
            "presence_penalty": req.presence_penalty,
            "ignore_eos": req.ignore_eos,
            "coupled": req.coupled,
            "min_tokens": req.min_tokens,
            # Which text the driver gives each choice (vLLM's definitions; Rust's TextAssembler, one place).
            "skip_special_tokens": req.skip_special_tokens,
            "include_stop_str_in_output": req.include_stop_str_in_output,
        }
        for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
            value = getattr(req, name)
            if value is not None:
                kw[name] = value
        if req.stop is not None:
            kw["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
        if req.stop_token_ids:
            try:  # checked now, as the prompt's ids are: a 400 naming the field before the request queues
                kw["stop_token_ids"] = _specrt.check_token_ids("stop_token_ids", req.stop_token_ids, decoder.vocab_size)
            except (VocabError, TypeError) as e:
                raise _BadFieldError("stop_token_ids", str(e)) from e
        return kw

    def _constrain(req: Any, kw: dict[str, Any]) -> str | None:
        """Put the request's structured-output field into the Decoder settings ``kw`` and check it now, before the
        request queues (the Rust resolver compiles the schema, regex or grammar; a bad one is a 400 naming the
        request field). Returns that field (None: the request has no constraint)."""
        found = _constraint_fields(req)
        if not found:
            return None
        param, arg, value = found[0]
        if param == "tool_choice":
            _check_tool_schemas(req)
        kw[arg] = value
        try:
            check_request("specrt serve", has_draft=decoder.draft_path is not None, **kw)
        except ConfigError as e:
            field = _param_of(e, req)
            if field is None or field.split(".", 1)[0] in _CONSTRAINT_SETTINGS:
                # The constraint itself: the request field that carried it, or the part of it the error names
                # ("response_format.json_schema.name").
                field = field if field is not None and field.startswith(param + ".") else param
            raise _BadFieldError(field, str(e)) from e
        return param

    def _check_tool_schemas(req: Any) -> None:
        """Each tool's ``parameters`` compiled alone (the Rust resolver, strict as the function says), so a bad one is
        a 400 naming ``tools.<i>.function.parameters`` rather than the tool-call grammar built from them."""
        for i, tool in enumerate(req.tools):
            fn = tool.function
            if fn.parameters is None:
                continue
            where = f"tools.{i}.function.parameters"
            rf = {"type": "json_schema", "json_schema": {"name": fn.name, "schema": fn.parameters}}
            rf["json_schema"]["strict"] = bool(fn.strict)
            try:
                check_request("specrt serve", has_draft=decoder.draft_path is not None, response_format=rf)
            except ConfigError as e:
                raise _BadFieldError(where, f"{where} (function {fn.name!r}): {e}") from e

    def _encode(text: str, add_special_tokens: bool, where: str, param: str) -> list[int]:
        try:
            return tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        except (TypeError, UnicodeError) as e:  # e.g. a lone surrogate, which is not text
            raise _BadFieldError(param, f"{where}: cannot be tokenized: {e}") from e

    def _prompt_ids(ids: list[int], where: str, param: str, truncate: int | None) -> list[int]:
        """Checked token ids of one prompt (kept to its last ``truncate`` tokens: vLLM's truncate_prompt_tokens)."""
        if not ids:
            raise _BadFieldError(param, f"{where}: the prompt is empty (expected at least one token)")
        try:
            ids = _specrt.check_token_ids("prompt", ids, decoder.vocab_size)
        except (VocabError, TypeError) as e:
            raise _BadFieldError(param, str(e) if where == param else f"{where}: {e}") from e
        return ids if truncate is None else ids[-truncate:]

    def _completion_prompts(req: Any) -> tuple[list[list[int]], list[str]]:
        """Each prompt's token ids (a string, a list of strings, token ids, or a list of token-id lists), and its
        text (for echo)."""
        p = req.prompt
        if isinstance(p, str):
            items: list[Any] = [p]
        elif not p:
            raise _BadFieldError("prompt", "prompt: the prompt is empty (expected at least one token)")
        elif isinstance(p[0], int):
            items = [p]
        else:
            items = list(p)
        add = True if req.add_special_tokens is None else req.add_special_tokens
        prompts, texts = [], []
        for k, item in enumerate(items):
            where = "prompt" if len(items) == 1 else f"prompt.{k}"
            ids = _encode(item, add, where, "prompt") if isinstance(item, str) else list(item)
            kept = _prompt_ids(ids, where, "prompt", req.truncate_prompt_tokens)
            prompts.append(kept)
            whole = isinstance(item, str) and len(kept) == len(ids)
            texts.append(item if whole else tokenizer.decode(kept, skip_special_tokens=req.skip_special_tokens))
        return prompts, texts

    def _messages(raw: list[Any]) -> list[dict[str, Any]]:
        """OpenAI messages as the chat template takes them (vLLM's and transformers' conventions): text content
        (text parts joined; ``null`` in an assistant message becomes ""), ``name``, ``tool_calls`` with their
        ``arguments`` parsed from JSON, ``tool_call_id``."""
        out = []
        for i, m in enumerate(raw):
            where = f"messages.{i}"
            content = m.content
            if content is None:
                if m.role != "assistant":
                    raise _BadFieldError(
                        f"{where}.content",
                        f"{where}.content: null is accepted in assistant messages only (role {m.role!r} needs text)",
                    )
                content = ""
            elif isinstance(content, list):  # OpenAI content parts: text only
                texts = []
                for part in content:
                    if part.get("type") != "text" or not isinstance(part.get("text"), str):
                        raise _BadFieldError(
                            f"{where}.content", f"{where}.content: only text parts are supported, got {part!r}"
                        )
                    texts.append(part["text"])
                content = "".join(texts)
            for name in ("refusal", "audio", "function_call"):
                if getattr(m, name) is not None:
                    raise _BadFieldError(
                        f"{where}.{name}",
                        f"{where}.{name} {_shown(getattr(m, name))} is not supported: the chat template has no place "
                        "for it (accepted: null; docs/openai-api.md)",
                    )
            msg: dict[str, Any] = {"role": m.role, "content": content}
            if m.name is not None:
                msg["name"] = m.name
            if m.tool_calls is not None:
                if m.role != "assistant":
                    raise _BadFieldError(
                        f"{where}.tool_calls",
                        f"{where}.tool_calls: only assistant messages call tools (role {m.role!r})",
                    )
                calls = []
                for j, call in enumerate(m.tool_calls):
                    text = call.function.arguments
                    try:
                        args = json.loads(text) if text.strip() else {}
                    except (ValueError, RecursionError) as e:
                        param = f"{where}.tool_calls.{j}.function.arguments"
                        raise _BadFieldError(param, f"{param}: not valid JSON ({e})") from e
                    calls.append(
                        {"id": call.id, "type": call.type, "function": {"name": call.function.name, "arguments": args}}
                    )
                msg["tool_calls"] = calls
            if m.tool_call_id is not None:
                if m.role != "tool":
                    raise _BadFieldError(
                        f"{where}.tool_call_id",
                        f"{where}.tool_call_id: only tool messages answer a tool call (role {m.role!r})",
                    )
                msg["tool_call_id"] = m.tool_call_id
            out.append(msg)
        return out

    def _chat_ids(req: Any) -> list[int]:
        """The prompt of chat messages: rendered with the model's chat template (``tools`` passed to it), the final
        message left open with ``continue_final_message``, encoded without special tokens unless
        ``add_special_tokens``."""
        messages = _messages(req.messages)
        tools = None if req.tools is None else [t.model_dump(exclude_none=True) for t in req.tools]
        extra = dict(req.chat_template_kwargs or {})
        try:
            text = decoder.apply_chat_template(
                messages,
                add_generation_prompt=req.add_generation_prompt,
                tools=tools,
                documents=req.documents,
                **extra,
            )
        except ConfigError as e:  # the template refused these messages, or failed on them (the Rust renderer's)
            # A value of tools / documents / chat_template_kwargs the renderer cannot take names that field; a
            # failure of the template itself is about the messages.
            raise _BadFieldError(_param_of(e, req) or "messages", str(e)) from e
        except TypeError as e:  # a kwarg named like one of the renderer's own parameters (messages, tools, ...)
            own = inspect.signature(decoder.apply_chat_template).parameters
            clash = sorted(k for k in extra if k in own and own[k].kind != inspect.Parameter.VAR_KEYWORD)
            raise _BadFieldError(
                "chat_template_kwargs",
                f"chat_template_kwargs: {', '.join(map(repr, clash))} cannot be set here (the request's own fields "
                "set them)",
            ) from e
        if req.continue_final_message:
            text = _continue_final(text, messages[-1]["content"])
        ids = _encode(text, bool(req.add_special_tokens), "messages", "messages")
        return _prompt_ids(ids, "messages", "messages", getattr(req, "truncate_prompt_tokens", None))

    def _seeds(req: Any) -> list[int]:
        """Choice i's seed: the request's seed + i, or a fresh random seed + i (modulo 2**64): n choices are n
        different samples (also under coupled sampling), and choice i equals a request of n = 1 with that seed."""
        base = secrets.randbits(63) if req.seed is None else req.seed
        return [(base + i) % 2**64 for i in range(req.n)]

    def _submit_all(
        endpoint: str,
        req: Any,
        kw: dict[str, Any],
        prompts: list[list[int]],
        source: str,
        max_tokens_field: str | None,
        echoes: list[str] | None = None,
    ) -> list[_Choice] | Any:
        """Queue every choice, all at once (so they share batched rounds): ``n`` per prompt, prompt-major (choice
        index = prompt index * n + i); or return the error response. ``max_tokens_field``: the field that set
        max_new_tokens (None: the server's default, capped to the room each prompt leaves)."""
        if state["draining"]:
            return _unavailable()
        if req.model is not None and req.model != model_name:
            return _model_not_found(req.model)
        if req.seed is not None:  # the range is Rust's (a u64); choice i's seed is seed + i modulo 2**64
            try:
                check_request("specrt serve", has_draft=decoder.draft_path is not None, seed=req.seed)
            except ConfigError as e:
                return _rejected(endpoint, str(e), _param_of(e, req))
        n_total = len(prompts) * req.n
        if n_total > scheduler.max_queue:
            return _rejected(
                endpoint,
                f"{'n' if req.n > 1 else source}: {len(prompts)} prompt(s) x n {req.n} = {n_total} generations exceed "
                f"this server's queue (max_queue {scheduler.max_queue}); send fewer at a time",
                "n" if req.n > 1 else source,
            )
        # Token ids and length are checked before queueing; the other settings when the request starts, before any
        # response is sent (see _reply), so a bad request is a 400, not a failed stream.
        budgets = []
        for k, ids in enumerate(prompts):
            where = source if len(prompts) == 1 else f"{source}.{k}"
            room = decoder.max_seq_len - len(ids)
            if room < 1:
                return _rejected(
                    endpoint,
                    f"{where}: {len(ids)} tokens leave no room to generate (maximum sequence length "
                    f"{decoder.max_seq_len})",
                    source,
                )
            if max_tokens_field is None:
                budgets.append(min(kw["max_new_tokens"], room))
            elif kw["max_new_tokens"] > room:
                return _rejected(
                    endpoint,
                    f"{max_tokens_field}: prompt of {len(ids)} tokens + {max_tokens_field} {kw['max_new_tokens']} "
                    f"exceeds the maximum sequence length {decoder.max_seq_len}"
                    + ("" if len(prompts) == 1 else f" ({where})"),
                    max_tokens_field,
                )
            else:
                budgets.append(kw["max_new_tokens"])
        if scheduler.queue_length + n_total > scheduler.max_queue:  # all or none (nothing else submits meanwhile)
            metrics.requests.labels(endpoint, "rejected_queue_full").inc()
            return _error(
                429,
                f"{scheduler.queue_length} requests are waiting (max_queue {scheduler.max_queue}); {n_total} more "
                "do not fit; retry later",
                "rate_limit_error",
                code="queue_full",
            )
        choices: list[_Choice] = []
        try:
            for k, ids in enumerate(prompts):
                for i, seed in enumerate(_seeds(req)):
                    handle = scheduler.submit(ids, **{**kw, "max_new_tokens": budgets[k], "seed": seed})
                    choices.append(_Choice(k * req.n + i, k, handle, len(ids), echoes[k] if echoes else ""))
        except (QueueFullError, SchedulerClosedError, ConfigError, SpecrtError, ValueError) as e:
            for c in choices:
                c.handle.cancel()
            if isinstance(e, QueueFullError):
                metrics.requests.labels(endpoint, "rejected_queue_full").inc()
                return _error(429, str(e), "rate_limit_error", code="queue_full")
            if isinstance(e, SchedulerClosedError):
                return _error(503, str(e), "server_error", code="shutting_down")
            return _rejected(endpoint, str(e), _param_of(e, req) or source)
        return choices

    def _rejected(endpoint: str, message: str, param: str | None) -> Any:
        metrics.requests.labels(endpoint, "invalid").inc()
        return _error(400, message, "invalid_request_error", param)

    def _outcome(error: BaseException | None, result: GenerationResult | None) -> str:
        if result is not None:
            return _FINISH.get(result.finish_reason, result.finish_reason)
        if isinstance(error, RequestTimeoutError):
            return "timeout"
        if isinstance(error, GenerationCancelled):
            return "cancelled"
        if isinstance(error, (ConfigError, VocabError, SequenceLengthError)):
            return "invalid"  # refused when it started (a 400, as one refused before queueing)
        return "error"

    async def _wait_all(request: Request, choices: list[_Choice]) -> None:
        """Every choice's result or error (``c.result`` / ``c.error``); a failed choice or a client that goes away
        cancels the others."""
        tasks = {asyncio.ensure_future(c.handle.aresult()): c for c in choices}
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, timeout=0.25, return_when=asyncio.FIRST_EXCEPTION)
                failed = False
                for t in done:
                    c = tasks[t]
                    if t.exception() is not None:
                        c.error, failed = t.exception(), True
                    else:
                        c.result = t.result()
                if failed or (pending and await request.is_disconnected()):
                    for c in choices:
                        c.handle.cancel()
        finally:
            for t in pending:
                t.cancel()
            for c in choices:
                if not c.handle.done:
                    c.handle.cancel()

    def _failure(error: BaseException, req: Any) -> Any:
        if isinstance(error, RequestTimeoutError):
            return _error(504, str(error), "timeout_error", code="request_timeout")
        if isinstance(error, GenerationCancelled):
            return _error(499, str(error), "cancelled", code="cancelled")
        if isinstance(error, (ConfigError, ValueError)):
            return _error(400, str(error), "invalid_request_error", _param_of(error, req))
        return _error(500, f"{type(error).__name__}: {error}", "server_error")

    byte_level = tokenizer.decoder_type == "ByteLevel"

    def _token_text(ids: list[int], as_ids: bool = False) -> list[str]:
        if as_ids:  # vLLM's return_tokens_as_token_ids
            return [f"token_id:{i}" for i in ids]
        return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]

    def _token_bytes(i: int) -> list[int]:
        """The token's own bytes (a piece of a multi-byte character stays that piece, unlike its decoded text)."""
        piece = tokenizer.id_to_token(i) or ""
        if byte_level and all(c in _BYTE_DECODER for c in piece):
            return [_BYTE_DECODER[c] for c in piece]
        m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)  # SentencePiece byte fallback
        if m:
            return [int(m.group(1), 16)]
        return list(piece.replace("\u2581", " ").encode("utf-8"))

    def _offsets(all_ids: list[int], start: int) -> list[int]:
        """Character offset in the generated text where each of ``all_ids[start:]`` begins."""
        return [
            len(tokenizer.decode(all_ids[:j], skip_special_tokens=True).rstrip("\ufffd"))
            for j in range(start, len(all_ids))
        ]

    async def _first(request: Request, handle: RequestHandle, chunks: Any) -> tuple[Any, BaseException | None]:
        """The request's first chunk (it has started and its settings were accepted), or its error; cancels it if
        the client goes away meanwhile."""
        task = asyncio.ensure_future(chunks.__anext__())
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                break
            if await request.is_disconnected():
                handle.cancel()  # ends it after its current round (or before it starts); the task then raises
        try:
            return task.result(), None
        except StopAsyncIteration:
            return None, GenerationCancelled("the request ended without output")
        except Exception as e:
            return None, e

    def _total_usage(choices: list[_Choice]) -> dict[str, Any]:
        """Usage of a whole request: each prompt's tokens once (OpenAI's and vLLM's count for n > 1), every
        choice's completion tokens, and of the prompt tokens those whose target KV the prefix cache supplied
        (``Stats.n_cached_tokens``; for n > 1 the first finished sample's of each prompt, as its tokens are
        counted once)."""
        n_prompt = sum({c.prompt_index: c.n_prompt for c in choices}.values())
        n_out = sum(len(c.result.token_ids) for c in choices if c.result is not None and not c.score_only)
        cached: dict[int, int] = {}
        for c in choices:
            if c.result is not None:
                cached.setdefault(c.prompt_index, c.result.stats.n_cached_tokens)
        return _usage(n_prompt, n_out, sum(cached.values()))

    async def _stream(
        request: Request,
        endpoint: str,
        req: Any,
        choices: list[_Choice],
        first_chunk: StreamChunk,
        event_of: Any,
        head: dict[str, Any],
    ) -> AsyncIterator[str]:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
        error: BaseException | None = None

        def event(c: _Choice, chunk: StreamChunk) -> str | None:
            """The server-sent event of one chunk of choice ``c`` (None: nothing to send)."""
            if chunk.result is not None:
                c.result = chunk.result
                # (The chunk of the last round carried the rest of the text; the result has no tokens of its own.)
                body = event_of(c, "", [], [], [], _FINISH.get(chunk.result.finish_reason))
                n_out = len(chunk.result.token_ids)
            else:
                if chunk.prompt_logprobs is not None:
                    c.prompt_chunk = chunk
                text = chunk.text  # the driver's text of this round (stop strings cut, partial characters held)
                c.n_out += len(chunk.token_ids)
                if not (text or chunk.token_ids or c.first):
                    return None
                body = event_of(c, text, chunk.token_ids, chunk.logprobs, chunk.top_logprobs, None)
                n_out = c.n_out
            if continuous:  # vLLM's continuous_usage_stats: this choice's counts so far
                body["usage"] = _usage(c.n_prompt, n_out)
            return _sse(body)

        try:
            text = event(choices[0], first_chunk)
            if text is not None:
                yield text
            async with contextlib.aclosing(_merged(choices)) as chunks:
                async for c, chunk in chunks:
                    text = event(c, chunk)
                    if text is not None:
                        yield text
                    if await request.is_disconnected():
                        for other in choices:
                            other.handle.cancel()
            if include_usage:
                results = [c.result for c in choices if c.result is not None]
                yield _sse(
                    {**head, "choices": [], "usage": _total_usage(choices), "speculative": _speculative(results)}
                )
        except RequestTimeoutError as e:
            error = e
            yield _error_event(str(e), "timeout_error", "request_timeout")
        except GenerationCancelled as e:
            error = e
        except Exception as e:
            error = e
            yield _error_event(f"{type(e).__name__}: {e}", "server_error", None)
        finally:
            for c in choices:
                if not c.handle.done:
                    c.handle.cancel()  # the client went away (the response was cancelled), or another choice failed
            for c in choices:
                err = c.error
                if c.result is None and err is None:
                    # Ended before its result without an error of its own: the client went away (also when the
                    # loop above had already cancelled the request on seeing the disconnect), or a sibling failed.
                    err = GenerationCancelled("client disconnected" if error is None else "another choice failed")
                metrics.observe(endpoint, c.handle, _outcome(err, c.result), c.result)
        yield "data: [DONE]\n\n"

    async def _reply(
        request: Request,
        endpoint: str,
        req: Any,
        choices: list[_Choice],
        head: dict[str, Any],
        chunk_object: str,
        event_of: Any,
        final_of: Any,
    ) -> Any:
        """A stream of server-sent events, or the whole response once every choice's result is in.

        A stream's HTTP status is sent only once the first choice has started and produced its first round, so a
        setting the engine refuses (or a timeout in the queue) is still an HTTP error, not an error event (the
        choices share their settings; each prompt's ids and length were checked before queueing)."""
        if req.stream:
            for c in choices:
                c.chunks = c.handle.aiter()
            first_chunk, error = await _first(request, choices[0].handle, choices[0].chunks)
            if first_chunk is None:
                assert error is not None
                for c in choices[1:]:
                    c.handle.cancel()
                for c in choices:
                    why = error if c is choices[0] else GenerationCancelled("another choice failed")
                    metrics.observe(endpoint, c.handle, _outcome(why, None), None)
                return _failure(error, req)
            chunk_head = {"id": head["id"], "object": chunk_object, "created": head["created"], "model": model_name}
            return StreamingResponse(
                _stream(request, endpoint, req, choices, first_chunk, event_of, chunk_head),
                media_type="text/event-stream",
            )
        await _wait_all(request, choices)
        for c in choices:
            metrics.observe(endpoint, c.handle, _outcome(c.error, c.result), c.result)
        errors = [c.error for c in choices if c.error is not None]
        if errors:
            return _failure(next((e for e in errors if not isinstance(e, GenerationCancelled)), errors[0]), req)
        results = [c.result for c in choices]
        return {
            **head,
            "model": model_name,
            # (final_of may set the finish reason: "tool_calls")
            "choices": [
                {"index": c.index, "finish_reason": _FINISH.get(c.result.finish_reason), **final_of(c, c.result)}
                for c in choices
            ],
            "usage": _total_usage(choices),
            "speculative": _speculative(results),
        }

    @app.post(
        "/v1/completions",
        openapi_extra=_body("CompletionRequest"),
        responses=_responses(_generation_ok("CompletionResponse"), 400, 404, 429, 499, 500, 503, 504),
    )
    async def completions(request: Request) -> Any:
        endpoint = "completions"
        req = await _parse(request, schemas["completion"])
        if not isinstance(req, schemas["completion"]):
            metrics.requests.labels(endpoint, "invalid").inc()  # refused by the request schema
            return req
        try:
            _check_policy(req, chat=False)
            score_only = req.max_tokens == 0
            if score_only and not (req.echo and not req.stream):
                raise _BadFieldError(
                    "max_tokens",
                    "max_tokens 0 scores the prompt only: it needs echo true and stream false (accepted otherwise: "
                    "max_tokens >= 1)",
                )
            # OpenAI's default of 16 tokens is a request setting like any other: too long a prompt for it is an error.
            # Scoring only generates one token (the engine always does), which is neither returned nor counted.
            kw = _kwargs(req, 16 if req.max_tokens is None else max(req.max_tokens, 1))
            _constrain(req, kw)
            prompts, texts = _completion_prompts(req)
        except _BadFieldError as e:
            return _rejected(endpoint, str(e), e.param)
        # Log-probabilities only when asked for: without them a greedy request reads only argmax ids.
        want_logprobs = req.logprobs is not None
        kw["logprobs"] = want_logprobs
        # OpenAI's legacy `logprobs: N`: N alternatives per token (0 = the chosen tokens only), from the target's
        # verification row of each position; with `echo`, the prompt's from the prefill pass too.
        kw["top_logprobs"] = req.logprobs or 0
        if req.echo and want_logprobs:
            kw["prompt_logprobs"] = req.logprobs
        choices = _submit_all(endpoint, req, kw, prompts, "prompt", "max_tokens", texts if req.echo else None)
        if not isinstance(choices, list):
            return choices
        for c in choices:
            c.score_only = score_only
        rid, created = f"cmpl-{req.request_id or uuid.uuid4().hex}", int(time.time())

        def alternatives(tops: list[list[tuple[int, float]]]) -> list[dict[str, float] | None] | None:
            """OpenAI's legacy top_logprobs: per token {token text: log-probability} (None with logprobs 0); of
            alternatives with equal texts the most likely one's value is kept."""
            if not req.logprobs:
                return None
            out = []
            for alts in tops:
                d: dict[str, float] = {}
                for text, (_, lp) in zip(_token_text([i for i, _ in alts]), alts, strict=True):
                    d.setdefault(text, lp)
                out.append(d)
            return out

        def logprobs_of(
            c: _Choice, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]]
        ) -> dict[str, Any] | None:
            start = len(c.seen)
            c.seen.extend(ids)  # text offsets count from the start of the choice's text
            if not want_logprobs:
                return None
            offset = len(c.echo)  # the generated text starts after the echoed prompt
            return {
                "tokens": _token_text(ids, req.return_tokens_as_token_ids),
                "token_logprobs": lps,
                "top_logprobs": alternatives(tops),
                "text_offset": [offset + o for o in _offsets(c.seen, start)],
            }

        def prompt_logprobs_of(c: _Choice, r: GenerationResult | StreamChunk) -> dict[str, Any]:
            """The echoed prompt's entries (first token: None, as OpenAI's), from the prefill pass (a result, or
            the first chunk of a stream)."""
            ids = r.prompt_token_ids or []
            tops = alternatives(r.prompt_top_logprobs)
            return {
                "tokens": _token_text(ids, req.return_tokens_as_token_ids),
                "token_logprobs": list(r.prompt_logprobs or []),
                "top_logprobs": None if tops is None else [None, *tops[1:]],
                "text_offset": [len(tokenizer.decode(ids[:j], skip_special_tokens=False)) for j in range(len(ids))],
            }

        def event_of(
            c: _Choice, text: str, ids: list[int], lps: list[float], tops: list, finish: str | None
        ) -> dict[str, Any]:
            lp = logprobs_of(c, ids, lps, tops)
            if c.first:
                if lp is not None and req.echo and c.prompt_chunk is not None:  # the prompt's entries come first
                    head = prompt_logprobs_of(c, c.prompt_chunk)
                    lp = {k: None if lp[k] is None else head[k] + lp[k] for k in lp}
                text, c.first = c.echo + text, False
            choice = {
                "index": c.index,
                "text": text,
                "logprobs": lp,
                "finish_reason": finish,
            }
            return {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model_name,
                "choices": [choice],
            }

        def final_of(c: _Choice, r: GenerationResult) -> dict[str, Any]:
            if c.score_only:  # the prompt's text and scores alone
                return {"text": c.echo, "logprobs": prompt_logprobs_of(c, r) if want_logprobs else None}
            lps = logprobs_of(c, r.token_ids, r.logprobs, r.top_logprobs)
            if lps is not None and req.echo:  # the prompt's entries first, then the generated tokens'
                head = prompt_logprobs_of(c, r)
                # (top_logprobs is None on both sides with logprobs 0, a list on both otherwise)
                lps = {k: None if lps[k] is None else head[k] + lps[k] for k in lps}
            return {"text": c.echo + _whole_text(c, r), "logprobs": lps}

        head = {"id": rid, "object": "text_completion", "created": created}
        return await _reply(request, endpoint, req, choices, head, "text_completion", event_of, final_of)

    @app.post(
        "/v1/chat/completions",
        openapi_extra=_body("ChatCompletionRequest"),
        responses=_responses(_generation_ok("ChatCompletionResponse"), 400, 404, 429, 499, 500, 503, 504),
    )
    async def chat_completions(request: Request) -> Any:
        endpoint = "chat_completions"
        req = await _parse(request, schemas["chat"])
        if not isinstance(req, schemas["chat"]):
            metrics.requests.labels(endpoint, "invalid").inc()  # refused by the request schema
            return req
        if req.top_logprobs is not None and not req.logprobs:
            return _rejected(endpoint, "top_logprobs: needs logprobs: true", "top_logprobs")
        field = "max_completion_tokens" if req.max_completion_tokens else "max_tokens" if req.max_tokens else None
        max_tokens = req.max_completion_tokens or req.max_tokens or default_max_tokens
        try:
            _check_policy(req, chat=True)
            kw = _kwargs(req, max_tokens)
            constrained_by = _constrain(req, kw)
            ids = _chat_ids(req)
        except _BadFieldError as e:
            return _rejected(endpoint, str(e), e.param)
        # tool_choice required / a function / auto: the output is parsed into tool calls.
        tool_mode = None if constrained_by != "tool_choice" else "auto" if req.tool_choice == "auto" else "forced"
        kw["logprobs"] = bool(req.logprobs)
        kw["top_logprobs"] = req.top_logprobs or 0  # from the target's verification row of each position
        choices = _submit_all(endpoint, req, kw, [ids], "messages", field)
        if not isinstance(choices, list):
            return choices
        if tool_mode is not None:
            for c in choices:
                c.tools = ToolCallParser(text_allowed=tool_mode == "auto")
        rid, created = f"chatcmpl-{req.request_id or uuid.uuid4().hex}", int(time.time())

        def entry(i: int, lp: float) -> dict[str, Any]:
            return {
                "token": _token_text([i], req.return_tokens_as_token_ids)[0],
                "logprob": lp,
                "bytes": _token_bytes(i),
            }

        def logprobs_of(ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]]) -> dict[str, Any] | None:
            if not req.logprobs:
                return None
            tops = tops or [[] for _ in ids]
            return {
                "content": [
                    {**entry(i, lp), "top_logprobs": [entry(a, alp) for a, alp in alts]}
                    for i, lp, alts in zip(ids, lps, tops, strict=True)
                ]
            }

        def event_of(
            c: _Choice, text: str, ids: list[int], lps: list[float], tops: list, finish: str | None
        ) -> dict[str, Any]:
            calls: list[dict[str, Any]] = []
            if c.tools is not None:  # tool calls: OpenAI's delta.tool_calls (index, id, name, then argument pieces)
                calls, text = c.tools.feed(text)
                if finish is not None:
                    text += c.tools.finish()[1]
                    if finish == "stop" and c.tools.complete:
                        finish = "tool_calls"
            if c.first:
                delta: dict[str, Any] = {"role": "assistant", "content": text}
                c.first = False
            else:
                delta = {"content": text} if text or (finish is None and not calls) else {}
            if calls:
                delta["tool_calls"] = calls
            choice = {
                "index": c.index,
                "delta": delta,
                "logprobs": logprobs_of(ids, lps, tops),
                "finish_reason": finish,
            }
            return {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model_name,
                "choices": [choice],
            }

        def final_of(c: _Choice, r: GenerationResult) -> dict[str, Any]:
            text = _whole_text(c, r)
            out: dict[str, Any] = {
                "message": {"role": "assistant", "content": text},
                "logprobs": logprobs_of(r.token_ids, r.logprobs, r.top_logprobs),
            }
            if c.tools is not None:
                c.tools.feed(text)
                c.tools.finish()
                # The answer is tool calls once one has begun (a stream has sent it as tool-call deltas already): a
                # call cut short by max_tokens or a stop string stays a call with the arguments written so far, as
                # OpenAI returns one cut by max_tokens; finish_reason "tool_calls" only when every call is complete.
                if c.tools.calls:
                    out["message"] = {
                        "role": "assistant",
                        "content": c.tools.content or None,  # tool_choice auto: the text before the first call
                        "tool_calls": c.tools.tool_calls(),
                    }
                    if c.tools.complete and _FINISH.get(r.finish_reason) == "stop":
                        out["finish_reason"] = "tool_calls"
            return out

        head = {"id": rid, "object": "chat.completion", "created": created}
        return await _reply(request, endpoint, req, choices, head, "chat.completion.chunk", event_of, final_of)

    @app.post(
        "/tokenize",
        openapi_extra=_body("TokenizeCompletionRequest", "TokenizeChatRequest"),
        responses=_responses(_json("TokenizeResponse", "The prompt's token ids"), 400, 404, 500),
    )
    async def tokenize(request: Request) -> Any:
        """vLLM's ``/tokenize``: a prompt (``add_special_tokens`` default true) or chat messages (rendered as a chat
        request renders them; ``add_special_tokens`` default false) -> token ids."""
        try:
            peek = json.loads(await request.body())
        except (ValueError, RecursionError):
            peek = None  # _parse says what is wrong
        chat = isinstance(peek, dict) and "messages" in peek
        schema = schemas["tokenize_chat" if chat else "tokenize_completion"]
        req = await _parse(request, schema)
        if not isinstance(req, schema):
            return req
        if req.model is not None and req.model != model_name:
            return _model_not_found(req.model)
        try:
            if chat:
                _check_policy(req, chat=True)
                ids = _chat_ids(req)
            else:
                ids = _encode(req.prompt, req.add_special_tokens, "prompt", "prompt")
        except _BadFieldError as e:
            return _error(400, str(e), "invalid_request_error", e.param)
        strs = [tokenizer.id_to_token(i) or "" for i in ids] if req.return_token_strs else None
        return {"count": len(ids), "max_model_len": decoder.max_seq_len, "tokens": ids, "token_strs": strs}

    @app.post(
        "/detokenize",
        openapi_extra=_body("DetokenizeRequest"),
        responses=_responses(_json("DetokenizeResponse", "The text of the token ids"), 400, 404, 500),
    )
    async def detokenize(request: Request) -> Any:
        """vLLM's ``/detokenize``: token ids -> text (special tokens included, as vLLM decodes them)."""
        req = await _parse(request, schemas["detokenize"])
        if not isinstance(req, schemas["detokenize"]):
            return req
        if req.model is not None and req.model != model_name:
            return _model_not_found(req.model)
        for k, t in enumerate(req.tokens):
            if not 0 <= t < decoder.vocab_size:
                return _error(
                    400,
                    f"tokens: token {t} at position {k} is out of range (expected 0 <= id < vocab size "
                    f"{decoder.vocab_size})",
                    "invalid_request_error",
                    "tokens",
                )
        return {"prompt": tokenizer.decode(req.tokens, skip_special_tokens=False)}

    @app.get(
        "/tokenizer_info",
        responses=_responses(_json("TokenizerInfoResponse", "The tokenizer's configuration (tokenizer_config.json)")),
    )
    async def tokenizer_info() -> Any:
        """vLLM's ``/tokenizer_info``: the tokenizer's configuration, as transformers' ``tokenizer_config.json``
        holds it (special tokens, chat template, ``tokenizer_class``)."""
        if state["tokenizer_info"] is None:
            state["tokenizer_info"] = _tokenizer_config(decoder)
        return state["tokenizer_info"]

    return app


class _BadFieldError(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


#: Type tags pydantic puts into the location of a union member's error ("prompt.str", "n.constrained-int").
_TYPE_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}


async def _parse(request: Any, schema: Any) -> Any:
    """The body validated against ``schema`` (JSON mode, strict), or a 400 response naming the first bad field."""
    from pydantic import ValidationError

    raw = await request.body()
    try:
        return schema.model_validate_json(raw or b"null")
    except ValidationError as e:
        errs = e.errors()
    first = errs[0]
    if first.get("type") == "json_invalid":
        why = first.get("ctx", {}).get("error", first.get("msg"))
        return _error(400, f"the body is not valid JSON: {why}", "invalid_request_error")
    if first.get("type") == "model_type" and not first.get("loc"):
        return _error(400, "the body must be a JSON object", "invalid_request_error")

    def param_of(err: dict) -> str | None:
        loc = [
            str(x)
            for x in err.get("loc", ())
            if isinstance(x, int) or (str(x).isidentifier() and str(x) not in _TYPE_TAGS)
        ]
        return ".".join(loc) or None

    param = param_of(first)
    # A union field reports one error per member ("a valid string", or at prompt.0 "a valid integer"): say all.
    msgs = []
    for err in errs:
        p = param_of(err) or ""
        if p == (param or "") or p.startswith(f"{param}."):
            text = err.get("msg", "invalid value") + (f" (at {p})" if p != param else "")
            if text not in msgs:
                msgs.append(text)
    msg = " or ".join(msgs)
    if first.get("type") == "extra_forbidden":
        msg = "unknown field (not part of the OpenAI API specrt serves, nor a specrt extension)"
    detail = f"{param}: {msg}" if param else msg
    given = first.get("input")
    if first.get("type") not in ("missing", "extra_forbidden") and not isinstance(given, (dict, list)):
        detail += f" (got {given!r})"
    return _error(400, detail, "invalid_request_error", param)


def _version() -> str:
    from specrt import __version__

    return __version__


def run_server(
    app: Any, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", drain_timeout_s: float = 60.0
) -> None:
    """Serve ``app`` with uvicorn until SIGINT / SIGTERM; then stop accepting and drain (at most
    ``drain_timeout_s`` seconds for open streams)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=int(drain_timeout_s))
