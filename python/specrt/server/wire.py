"""OpenAI's wire format: error bodies, server-sent events, ``usage`` and specrt's ``speculative`` field, finish
reasons, byte-level BPE bytes."""

from __future__ import annotations

import json
from typing import Any

from specrt.generate import GenerationResult

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "grammar": "stop"}


#: Retry-After seconds of a 429 (the queue is full: a slot frees when a request ends) and a 503 (shutting down: this
#: process will not come back, a restarted one or another replica may).
RETRY_AFTER_S = {429: 1, 503: 10}


def error_response(
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
    if status in RETRY_AFTER_S:
        headers.setdefault("Retry-After", str(RETRY_AFTER_S[status]))
    return JSONResponse(body, status_code=status, headers=headers or None)


def error_event(message: str, type_: str, code: str | None) -> str:
    return sse({"error": {"message": message, "type": type_, "param": None, "code": code}})


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def speculative(results: list[GenerationResult]) -> dict[str, Any]:
    """The ``speculative`` field: one result's statistics, or for several choices the summed counts (``rounds_by_k``
    summed per K; the phase times in ms summed), the rates of the sums, and the mean of the choices' decode
    tokens/s. ``rounds_by_k[k]`` = rounds that verified k draft tokens (auto K's choices; k = 0: a plain target
    step); ``prefill_ms`` / ``draft_ms`` / ``target_ms`` = wall time in the prompt prefill, the draft's passes and the
    target's passes after it (in a batch, the whole batched pass each row took part in)."""
    stats = [r.stats for r in results]
    out: dict[str, Any] = {k: sum(getattr(s, k) for s in stats) for k in SPEC_COUNTS}
    n_emitted = out["n_accepted"] + out["n_recovered"] + out["n_bonus"]
    rates = [s.decode_tokens_per_s for s in stats if s.decode_tokens_per_s is not None]
    rounds_by_k = [0] * max((len(s.rounds_by_k) for s in stats), default=0)
    for s in stats:
        for k, n in enumerate(s.rounds_by_k):
            rounds_by_k[k] += n
    return {
        "acceptance_rate": out["n_accepted"] / out["n_drafted"] if out["n_drafted"] else None,
        "mean_tokens_per_round": n_emitted / out["n_rounds"] if out["n_rounds"] else None,
        **out,
        "decode_tokens_per_s": sum(rates) / len(rates) if rates else None,
        "rounds_by_k": rounds_by_k,
        **{k: round(sum(getattr(s, k) for s in stats), 3) for k in SPEC_TIMES},
    }


SPEC_COUNTS = ("n_rounds", "n_drafted", "n_accepted", "n_recovered", "n_bonus")
SPEC_TIMES = ("prefill_ms", "draft_ms", "target_ms")


def usage(n_prompt: int, n_out: int, n_cached: int | None = None) -> dict[str, Any]:
    """OpenAI's ``usage``; with ``n_cached`` (prompt tokens whose KV came from the prefix cache) also
    ``prompt_tokens_details.cached_tokens``, as OpenAI and vLLM report it."""
    usage: dict[str, Any] = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
    if n_cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": n_cached}
    return usage


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


BYTE_DECODER = _gpt2_byte_decoder()
