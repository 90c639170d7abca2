"""``specrt serve`` on a Ray cluster (Ray Serve): one replica per machine or GPU, each running the OpenAI-compatible
app of :mod:`specrt.server` on its own :class:`~specrt.Decoder`; Ray Serve's proxy routes requests across replicas.

From Python::

    from ray import serve
    from specrt.ray_serve import deployment

    serve.run(deployment("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", num_replicas=2))

From the shell (Ray's own CLI; ``pip install 'specrt[ray]'``)::

    serve run specrt.ray_serve:app_builder target=qwen2.5-coder-1.5b-instruct draft=qwen2.5-coder-0.5b-instruct \\
        num_replicas=2

Each replica loads the models itself (they must be in its machine's ``~/.cache/specrt`` or at the given paths).
``max_batch=4`` (or ``decoder_kwargs={"max_batch": 4}``) runs batched rounds in each replica (the batched model
layout, see :class:`specrt.Decoder`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specrt.server.defaults import API_KEY_ENV

__all__ = ["app_builder", "deployment"]


def deployment(
    target: str | Path,
    draft: str | Path | None = None,
    *,
    model_name: str | None = None,
    num_replicas: int = 1,
    num_cpus: float | None = None,
    num_gpus: float = 0,
    decoder_kwargs: dict[str, Any] | None = None,
    app_kwargs: dict[str, Any] | None = None,
) -> Any:
    """A Ray Serve application serving ``target`` (+ ``draft``) through :func:`specrt.server.create_app`.

    Args:
        target, draft: model names (``specrt models list``) or converted folders, as for :class:`~specrt.Decoder`.
        model_name: the model id clients send (default: ``target``'s name).
        num_replicas: replicas (each a process with its own Decoder); Ray places them on the cluster's nodes.
        num_cpus, num_gpus: Ray resources per replica (``num_gpus=1`` with ``decoder_kwargs={"provider": "cuda"}``
            for one replica per GPU).
        decoder_kwargs: extra :class:`~specrt.Decoder` arguments (``max_seq_len``, ``provider``, ...).
        app_kwargs: extra :func:`specrt.server.create_app` arguments (``max_queue``, ``request_timeout_s``, ...).

    Returns:
        The bound ``ray.serve.Application`` (give it to ``serve.run``).

    Raises:
        ImportError: Ray Serve is not installed (``pip install 'specrt[ray]'``).
    """
    from ray import serve

    target, draft = str(target), None if draft is None else str(draft)
    name = model_name or Path(target).name
    dec_kw = dict(decoder_kwargs or {})
    app_kw = dict(app_kwargs or {})

    def build_app() -> Any:
        # Runs on each replica: the models load there, not in the driver.
        from specrt.generate import Decoder
        from specrt.server import create_app

        return create_app(Decoder(target, draft, **dec_kw), model_name=name, **app_kw)

    options: dict[str, Any] = {"num_gpus": num_gpus}
    if num_cpus is not None:
        options["num_cpus"] = num_cpus

    @serve.deployment(name="specrt", num_replicas=num_replicas, ray_actor_options=options)
    @serve.ingress(build_app)
    class SpecrtServer:
        """One replica: the specrt OpenAI-compatible app on its own Decoder."""

    return SpecrtServer.bind()


def app_builder(args: dict[str, str]) -> Any:
    """For ``serve run specrt.ray_serve:app_builder key=value ...``: ``target`` (required), ``draft``,
    ``model_name``, ``num_replicas``, ``num_cpus``, ``num_gpus``, ``max_seq_len``, ``provider``, ``max_queue``,
    ``request_timeout_s``, ``num_speculative_tokens`` (an int or ``auto``), ``proposer`` (as ``specrt serve
    --proposer``), ``max_batch`` (batched rounds in each replica), ``dtype`` and ``draft_dtype`` (weights pulled
    for model names, as :class:`specrt.Decoder`), and
    ``specrt serve``'s network options: ``api_key`` (comma-separated keys; ``$SPECRT_API_KEY`` adds one),
    ``metrics_need_key``, ``max_request_bytes``, ``body_timeout_s``.

    Raises:
        ConfigError: no ``target``, or a key it does not know (named).
    """
    from specrt.errors import ConfigError

    known = {
        "target", "draft", "model_name", "num_replicas", "num_cpus", "num_gpus", "max_seq_len", "provider",
        "max_queue", "request_timeout_s", "num_speculative_tokens", "proposer", "max_batch", "dtype", "draft_dtype",
        "api_key", "metrics_need_key", "max_request_bytes", "body_timeout_s",
    }  # fmt: skip
    unknown = sorted(set(args) - known)
    if unknown:
        raise ConfigError(f"unknown arguments {unknown} (expected some of: {', '.join(sorted(known))})")
    if "target" not in args:
        raise ConfigError("target=<model name or folder> is required")
    dec_kw: dict[str, Any] = {}
    if "max_seq_len" in args:
        dec_kw["max_seq_len"] = int(args["max_seq_len"])
    if "provider" in args:
        dec_kw["provider"] = args["provider"]
    if "max_batch" in args:  # batched rounds in each replica (Decoder(max_batch=N))
        dec_kw["max_batch"] = int(args["max_batch"])
    for key in ("dtype", "draft_dtype"):
        if key in args:
            dec_kw[key] = args[key]
    app_kw: dict[str, Any] = {}
    if "max_queue" in args:
        app_kw["max_queue"] = int(args["max_queue"])
    if "request_timeout_s" in args:
        app_kw["request_timeout_s"] = float(args["request_timeout_s"])
    if "num_speculative_tokens" in args:
        k = args["num_speculative_tokens"]
        app_kw["num_speculative_tokens"] = k if k == "auto" else int(k)
    if "proposer" in args:
        app_kw["proposer"] = args["proposer"]
    # API keys as `specrt serve` takes them: api_key=K1,K2 and $SPECRT_API_KEY (read here, in the driver).
    keys = [k for k in args.get("api_key", "").split(",") if k]
    if os.environ.get(API_KEY_ENV):
        keys.append(os.environ[API_KEY_ENV])
    if keys:
        app_kw["api_keys"] = keys
    if "metrics_need_key" in args:
        app_kw["metrics_need_key"] = args["metrics_need_key"].lower() in ("1", "true", "yes")
    if "max_request_bytes" in args:
        app_kw["max_request_bytes"] = int(args["max_request_bytes"])
    if "body_timeout_s" in args:
        app_kw["body_timeout_s"] = float(args["body_timeout_s"])
    return deployment(
        args["target"],
        args.get("draft"),
        model_name=args.get("model_name"),
        num_replicas=int(args.get("num_replicas", 1)),
        num_cpus=float(args["num_cpus"]) if "num_cpus" in args else None,
        num_gpus=float(args.get("num_gpus", 0)),
        decoder_kwargs=dec_kw,
        app_kwargs=app_kw,
    )
