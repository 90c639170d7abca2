"""A request's prompt token ids: completions prompts (text or ids) and chat messages through the chat template."""

from __future__ import annotations

import inspect
import json
from typing import Any

from specrt import _specrt
from specrt.errors import ConfigError, VocabError
from specrt.server.context import ServerContext
from specrt.server.policy import BadFieldError, param_of, shown


def continue_final(text: str, final: str) -> str:
    """``text`` (a rendered chat) cut right after the final message's content, so the model continues it
    (transformers' ``continue_final_message``; templates that strip the content are matched stripped)."""
    if not final:
        return text
    for f in (final, final.strip()):
        if f and f in text:
            return text[: text.rindex(f) + len(f)]
    raise BadFieldError(
        "continue_final_message",
        "continue_final_message: the final message's content does not appear in the rendered chat, so it cannot be "
        "continued",
    )


def encode(ctx: ServerContext, text: str, add_special_tokens: bool, where: str, param: str) -> list[int]:
    try:
        return ctx.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
    except (TypeError, UnicodeError) as e:  # e.g. a lone surrogate, which is not text
        raise BadFieldError(param, f"{where}: cannot be tokenized: {e}") from e


def prompt_ids(ctx: ServerContext, ids: list[int], where: str, param: str, truncate: int | None) -> list[int]:
    """Checked token ids of one prompt (kept to its last ``truncate`` tokens: vLLM's truncate_prompt_tokens)."""
    if not ids:
        raise BadFieldError(param, f"{where}: the prompt is empty (expected at least one token)")
    try:
        ids = _specrt.check_token_ids("prompt", ids, ctx.decoder.vocab_size)
    except (VocabError, TypeError) as e:
        raise BadFieldError(param, str(e) if where == param else f"{where}: {e}") from e
    return ids if truncate is None else ids[-truncate:]


def completion_prompts(ctx: ServerContext, req: Any) -> tuple[list[list[int]], list[str]]:
    """Each prompt's token ids (a string, a list of strings, token ids, or a list of token-id lists), and its
    text (for echo)."""
    p = req.prompt
    if isinstance(p, str):
        items: list[Any] = [p]
    elif not p:
        raise BadFieldError("prompt", "prompt: the prompt is empty (expected at least one token)")
    elif isinstance(p[0], int):
        items = [p]
    else:
        items = list(p)
    add = True if req.add_special_tokens is None else req.add_special_tokens
    prompts, texts = [], []
    for k, item in enumerate(items):
        where = "prompt" if len(items) == 1 else f"prompt.{k}"
        ids = encode(ctx, item, add, where, "prompt") if isinstance(item, str) else list(item)
        kept = prompt_ids(ctx, ids, where, "prompt", req.truncate_prompt_tokens)
        prompts.append(kept)
        whole = isinstance(item, str) and len(kept) == len(ids)
        texts.append(item if whole else ctx.tokenizer.decode(kept, skip_special_tokens=req.skip_special_tokens))
    return prompts, texts


def chat_messages(ctx: ServerContext, raw: list[Any]) -> list[dict[str, Any]]:
    """OpenAI messages as the chat template takes them (vLLM's and transformers' conventions): text content
    (text parts joined; ``null`` in an assistant message becomes ""), ``name``, ``tool_calls`` with their
    ``arguments`` parsed from JSON, ``tool_call_id``."""
    out = []
    for i, m in enumerate(raw):
        where = f"messages.{i}"
        content = m.content
        if content is None:
            if m.role != "assistant":
                raise BadFieldError(
                    f"{where}.content",
                    f"{where}.content: null is accepted in assistant messages only (role {m.role!r} needs text)",
                )
            content = ""
        elif isinstance(content, list):  # OpenAI content parts: text only
            texts = []
            for part in content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise BadFieldError(
                        f"{where}.content", f"{where}.content: only text parts are supported, got {part!r}"
                    )
                texts.append(part["text"])
            content = "".join(texts)
        for name in ("refusal", "audio", "function_call"):
            if getattr(m, name) is not None:
                raise BadFieldError(
                    f"{where}.{name}",
                    f"{where}.{name} {shown(getattr(m, name))} is not supported: the chat template has no place "
                    "for it (accepted: null; docs/openai-api.md)",
                )
        msg: dict[str, Any] = {"role": m.role, "content": content}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_calls is not None:
            if m.role != "assistant":
                raise BadFieldError(
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
                    raise BadFieldError(param, f"{param}: not valid JSON ({e})") from e
                calls.append(
                    {"id": call.id, "type": call.type, "function": {"name": call.function.name, "arguments": args}}
                )
            msg["tool_calls"] = calls
        if m.tool_call_id is not None:
            if m.role != "tool":
                raise BadFieldError(
                    f"{where}.tool_call_id",
                    f"{where}.tool_call_id: only tool messages answer a tool call (role {m.role!r})",
                )
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def chat_ids(ctx: ServerContext, req: Any) -> list[int]:
    """The prompt of chat messages: rendered with the model's chat template (``tools`` passed to it), the final
    message left open with ``continue_final_message``, encoded without special tokens unless
    ``add_special_tokens``."""
    messages = chat_messages(ctx, req.messages)
    tools = None if req.tools is None else [t.model_dump(exclude_none=True) for t in req.tools]
    extra = dict(req.chat_template_kwargs or {})
    try:
        text = ctx.decoder.apply_chat_template(
            messages,
            add_generation_prompt=req.add_generation_prompt,
            tools=tools,
            documents=req.documents,
            **extra,
        )
    except ConfigError as e:  # the template refused these messages, or failed on them (the Rust renderer's)
        # A value of tools / documents / chat_template_kwargs the renderer cannot take names that field; a
        # failure of the template itself is about the messages.
        raise BadFieldError(param_of(e, req) or "messages", str(e)) from e
    except TypeError as e:  # a kwarg named like one of the renderer's own parameters (messages, tools, ...)
        own = inspect.signature(ctx.decoder.apply_chat_template).parameters
        clash = sorted(k for k in extra if k in own and own[k].kind != inspect.Parameter.VAR_KEYWORD)
        raise BadFieldError(
            "chat_template_kwargs",
            f"chat_template_kwargs: {', '.join(map(repr, clash))} cannot be set here (the request's own fields "
            "set them)",
        ) from e
    if req.continue_final_message:
        text = continue_final(text, messages[-1]["content"])
    ids = encode(ctx, text, bool(req.add_special_tokens), "messages", "messages")
    return prompt_ids(ctx, ids, "messages", "messages", getattr(req, "truncate_prompt_tokens", None))
