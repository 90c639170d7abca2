"""The request and response schemas (pydantic; strict), the OpenAPI document's pieces, and the body parser that
answers a bad body with OpenAI's 400 naming the field."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from specrt import _specrt
from specrt.server.wire import RETRY_AFTER_S, error_response

#: Most stop strings a request may give (OpenAI allows 4, vLLM sets no limit; lm-eval sends its ``until`` strings and
#: EOS): each round searches the new text for each of them.
MAX_STOPS = 256


def pydantic_models() -> dict[str, Any]:
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
        seed: int | None = None  # 0 <= seed < 2**64, checked by the Rust resolver (submit_all)
        stop: str | Annotated[list[str], Field(max_length=MAX_STOPS)] | None = None
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
        proposer: str | None = None  # one of _specrt.PROPOSERS, checked by the Rust resolver (a 400 naming it)
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
        rounds_by_k: list[int]
        prefill_ms: float
        draft_ms: float
        target_ms: float

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


# ----- /openapi.json ---------------------------------------------------------------------------------------------
REQUEST_MODELS = ("completion", "chat", "tokenize_completion", "tokenize_chat", "detokenize")


STATUS_TEXT = {
    400: "A malformed request, or a field specrt refuses (docs/openai-api.md); `param` names the field",
    404: "Another model than the one served",
    429: "The queue is full",
    499: "The client went away before the result",
    500: "An internal error",
    503: "The server is shutting down",
    504: "The request ran past the server's request timeout",
}


def openapi_components(schemas: dict[str, Any]) -> dict[str, Any]:
    """JSON schemas of the request models (as validated) and the response models (as sent), by name, for
    ``#/components/schemas``."""
    from pydantic.json_schema import models_json_schema

    models = [(schemas[k], "validation") for k in REQUEST_MODELS]
    models += [(m, "serialization") for m in schemas["responses"]]
    _, top = models_json_schema(models, ref_template="#/components/schemas/{model}")
    return top.get("$defs", {})


def schema_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def body_doc(*names: str) -> dict[str, Any]:
    """An operation's ``openapi_extra``: a JSON request body of one of the named schemas."""
    schema = schema_ref(names[0]) if len(names) == 1 else {"oneOf": [schema_ref(n) for n in names]}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def json_doc(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema_ref(name)}}}


def generation_ok(name: str) -> dict[str, Any]:
    """200 of a generation endpoint: the whole response as JSON, or with ``stream: true`` server-sent events."""
    ok = json_doc(name, "The completion (JSON), or with stream: true its chunks as server-sent events")
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


def responses_doc(ok: dict[str, Any], *statuses: int) -> dict[int | str, dict[str, Any]]:
    """An operation's documented responses: ``ok`` (200) and the error statuses, in OpenAI's error schema (with
    ``Retry-After`` where it is sent)."""
    out: dict[int | str, dict[str, Any]] = {200: ok}
    for status in statuses:
        response = json_doc("ErrorResponse", STATUS_TEXT[status])
        if status in RETRY_AFTER_S:
            response["headers"] = {
                "Retry-After": {"description": "Seconds to wait before retrying", "schema": {"type": "string"}}
            }
        out[status] = response
    return out


#: Type tags pydantic puts into the location of a union member's error ("prompt.str", "n.constrained-int").
TYPE_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}


async def parse_body(request: Any, schema: Any) -> Any:
    """The body validated against ``schema`` (JSON mode, strict), or a 400 response naming the first bad field."""
    from pydantic import ValidationError

    raw = await request.body()
    try:  # off the event loop: a large body takes a while to validate, and /health must answer meanwhile
        return await asyncio.to_thread(schema.model_validate_json, raw or b"null")
    except ValidationError as e:
        errs = e.errors()
    first = errs[0]
    if first.get("type") == "json_invalid":
        why = first.get("ctx", {}).get("error", first.get("msg"))
        return error_response(400, f"the body is not valid JSON: {why}", "invalid_request_error")
    if first.get("type") == "model_type" and not first.get("loc"):
        return error_response(400, "the body must be a JSON object", "invalid_request_error")

    def param_of(err: dict) -> str | None:
        loc = [
            str(x)
            for x in err.get("loc", ())
            if isinstance(x, int) or (str(x).isidentifier() and str(x) not in TYPE_TAGS)
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
    return error_response(400, detail, "invalid_request_error", param)
