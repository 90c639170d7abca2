"""vLLM's ``POST /tokenize``, ``POST /detokenize`` and ``GET /tokenizer_info``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import Request

from specrt import _specrt
from specrt.errors import VocabError
from specrt.server.context import ServerContext, model_not_found
from specrt.server.policy import BadFieldError, check_policy
from specrt.server.prompts import chat_ids, encode
from specrt.server.schemas import parse_body
from specrt.server.wire import error_response


def tokenizer_config(decoder: Any) -> dict[str, Any]:
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


async def tokenize(ctx: ServerContext, request: Request) -> Any:
    """vLLM's ``/tokenize``: a prompt (``add_special_tokens`` default true) or chat messages (rendered as a chat
    request renders them; ``add_special_tokens`` default false) -> token ids."""
    try:
        peek = await asyncio.to_thread(json.loads, await request.body())
    except (ValueError, RecursionError):
        peek = None  # _parse says what is wrong
    chat = isinstance(peek, dict) and "messages" in peek
    schema = ctx.schemas["tokenize_chat" if chat else "tokenize_completion"]
    req = await parse_body(request, schema)
    if not isinstance(req, schema):
        return req
    if req.model is not None and req.model != ctx.model_name:
        return model_not_found(ctx, req.model)

    def prompt_ids() -> list[int]:
        if chat:
            check_policy(req, chat=True)
            return chat_ids(ctx, req)
        return encode(ctx, req.prompt, req.add_special_tokens, "prompt", "prompt")

    try:  # off the event loop (templating and tokenizing a long prompt take a while)
        ids = await asyncio.to_thread(prompt_ids)
    except BadFieldError as e:
        return error_response(400, str(e), "invalid_request_error", e.param)
    strs = [ctx.tokenizer.id_to_token(i) or "" for i in ids] if req.return_token_strs else None
    return {"count": len(ids), "max_model_len": ctx.decoder.max_seq_len, "tokens": ids, "token_strs": strs}


async def detokenize(ctx: ServerContext, request: Request) -> Any:
    """vLLM's ``/detokenize``: token ids -> text (special tokens included, as vLLM decodes them)."""
    req = await parse_body(request, ctx.schemas["detokenize"])
    if not isinstance(req, ctx.schemas["detokenize"]):
        return req
    if req.model is not None and req.model != ctx.model_name:
        return model_not_found(ctx, req.model)
    try:  # the vocabulary check every prompt gets (Rust's)
        ids = _specrt.check_token_ids("tokens", req.tokens, ctx.decoder.vocab_size)
    except VocabError as e:
        return error_response(400, f"tokens: {e}", "invalid_request_error", "tokens")
    return {"prompt": await asyncio.to_thread(ctx.tokenizer.decode, ids, skip_special_tokens=False)}


async def tokenizer_info(ctx: ServerContext, request: Request) -> Any:
    """vLLM's ``/tokenizer_info``: the tokenizer's configuration, as transformers' ``tokenizer_config.json``
    holds it (special tokens, chat template, ``tokenizer_class``)."""
    if ctx.state["tokenizer_info"] is None:
        ctx.state["tokenizer_info"] = tokenizer_config(ctx.decoder)
    return ctx.state["tokenizer_info"]
