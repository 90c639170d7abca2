"""Which request fields ``specrt serve`` refuses, and how a refusal names its field (OpenAI's ``param``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

#: Why ``structural_tag`` is refused (also as a ``structured_outputs`` key).
STRUCTURAL_TAG = (
    "vLLM's structural tags (free text with tagged, schema-constrained regions) are not translated yet; use tools with "
    'tool_choice "auto", or guided_grammar / structured_outputs.grammar (llguidance Lark, which inlines %json schemas)'
)


#: Fields refused unless they hold a value that leaves the output as it is, because ignoring them would change the
#: output (docs/openai-api.md): field -> (accepted(value), the accepted values, why the others are refused). Fields a
#: request type lacks are skipped.
REFUSED_UNLESS: dict[str, tuple[Callable[[Any], bool], str, str]] = {
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
    "structural_tag": (lambda v: v is None, "null", STRUCTURAL_TAG),
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
REFUSED_UNLESS_CHAT = {
    "echo": (lambda v: not v, "false", "prepending the last message is not implemented"),
}


def shown(value: Any) -> str:
    """A request value as JSON text (pydantic models as their dict), for error messages."""
    if hasattr(value, "model_dump"):
        value = value.model_dump(exclude_none=True)
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def check_policy(req: Any, chat: bool) -> None:
    """Refuse the fields that would change the output if they were ignored (``_BadFieldError`` naming the field,
    its value and the accepted values); cross-field rules OpenAI and vLLM also enforce."""
    table = {**REFUSED_UNLESS, **(REFUSED_UNLESS_CHAT if chat else {})}
    for name, (accepted, allowed, why) in table.items():
        if name not in type(req).model_fields:
            continue
        value = getattr(req, name)
        if not accepted(value):
            raise BadFieldError(
                name, f"{name} {shown(value)} is not supported: {why} (accepted: {allowed}; docs/openai-api.md)"
            )
    best_of = getattr(req, "best_of", None)
    if best_of is not None and best_of != req.n:
        why = (
            "must be >= n"
            if best_of < req.n
            else "ranking best_of samples by log-probability is not implemented (accepted: best_of == n or null)"
        )
        raise BadFieldError("best_of", f"best_of {best_of} with n {req.n}: {why}")
    if getattr(req, "continue_final_message", False) and req.add_generation_prompt:
        raise BadFieldError(
            "continue_final_message",
            "continue_final_message true needs add_generation_prompt false (the final message is continued, no new "
            "one is started)",
        )


#: specrt's setting names (a ``ConfigError``'s ``field``) -> the request fields that set them, where the names differ;
#: every other setting has its request field's name. ``max_new_tokens`` is ``max_completion_tokens`` when a chat
#: request used that, and ``prompt`` (the token ids) is a chat request's ``messages`` (see :func:`param_of`).
REQUEST_FIELDS = {
    "max_new_tokens": "max_tokens",
    "kwargs": "chat_template_kwargs",  # the chat template's keyword arguments
}


#: The Decoder's constraint arguments (the values of :data:`specrt.server.structured.GUIDED` and
#: :data:`specrt.server.structured.STRUCTURED_OUTPUTS`) and the kinds their errors name: a refusal of one of them is
#: about the request field that carried the constraint.
CONSTRAINT_SETTINGS = {"response_format", "json_schema", "json_object", "regex", "grammar", "choice"}


def param_of(error: BaseException, req: Any = None) -> str | None:
    """The request field a refused setting is about (OpenAI's ``param``): the ``field`` of a ``ConfigError`` from the
    Rust validators, in the request's words (None: the error names no setting)."""
    field = getattr(error, "field", None)
    if not isinstance(field, str):
        return None
    if field == "max_new_tokens" and getattr(req, "max_completion_tokens", None):
        return "max_completion_tokens"
    if field == "prompt" and hasattr(req, "messages"):
        return "messages"
    return REQUEST_FIELDS.get(field, field)


class BadFieldError(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
