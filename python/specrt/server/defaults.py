"""The defaults of ``specrt serve`` (one definition: the CLI's flags, :func:`specrt.server.create_app` and
:func:`specrt.server.run_server` read them). Importing this module loads no web framework.

Defaults that differ on purpose from the Decoder's (``_specrt.request_defaults()``: 128 new tokens, K = 4): a server
picks K per request (``"auto"``) and then, with a draft model, the proposer per round (``"auto"``); chat requests get
256 tokens and completions OpenAI's 16."""

from __future__ import annotations

#: K of requests that set no ``num_speculative_tokens``: the cost-model controller picks it per round.
NUM_SPECULATIVE_TOKENS: int | str = "auto"
#: Proposer of requests that set no ``proposer`` and whose K is ``"auto"`` when the server has a draft model: each
#: round the controller chooses a plain step, prompt lookup or the draft model (``"auto"``). With a fixed K, or
#: without a draft model: the Decoder's default (the draft model; target-only without one).
PROPOSER_WITH_DRAFT = "auto"
#: ``max_tokens`` of chat requests that set neither it nor ``max_completion_tokens``.
CHAT_MAX_TOKENS = 256
#: ``max_tokens`` of completions requests that do not set it (OpenAI's default).
COMPLETIONS_MAX_TOKENS = 16
#: Seconds from a request's arrival after which it ends (504, or an error event once streaming).
REQUEST_TIMEOUT_S = 600.0
#: Seconds open streams get to finish at shutdown.
DRAIN_TIMEOUT_S = 60.0
#: Address and TCP port the server listens on.
HOST = "127.0.0.1"
PORT = 8000
#: Largest request body, in bytes (TGI's --payload-limit is 2 MB; a 4 MiB body holds a 1M-token id list's JSON).
MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: Seconds a request body may take to arrive (from the request's start): a slower one is a 408.
BODY_TIMEOUT_S = 30.0
#: Environment variable holding an API key (as if given with --api-key).
API_KEY_ENV = "SPECRT_API_KEY"
