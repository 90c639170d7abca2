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
  ``top_k``, ``min_p``, ``repetition_penalty``, ``num_speculative_tokens`` (int or ``"auto"``), ``proposer`` (one of
  ``_specrt.PROPOSERS``), ``ignore_eos``, ``coupled``; so are vLLM's ``stop_token_ids``,
  ``include_stop_str_in_output``, ``skip_special_tokens``,
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

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "run_server"]

#: The package's modules, one job each: ``app`` (create_app: the routes; run_server), ``context`` (what the routes
#: share), ``completions`` / ``chat`` / ``tokenize`` (the routes), ``prompts`` and ``settings`` (a request -> prompt ids
#: and Decoder settings), ``generation`` (queueing choices, whole and streamed answers), ``structured`` (structured
#: output and tools), ``policy`` (refused fields, ``param``), ``schemas`` (pydantic models, OpenAPI, body parsing),
#: ``wire`` (OpenAI's error / SSE / usage formats), ``metrics`` (Prometheus).


def __getattr__(name: str) -> Any:
    # create_app / run_server load FastAPI (``specrt[serve]``): imported on first use, so ``import specrt.server``
    # works without it.
    if name in __all__:
        from specrt.server import app

        return getattr(app, name)
    raise AttributeError(f"module 'specrt.server' has no attribute {name!r}")
