"""End-to-end benchmark behind ``specrt bench``: speculative vs target-only decoding, measured against the cost model.

For a target, a draft and a prompt set (``specrt/bench/prompts.json``, shipped in the package) the bench runs, in one
process:

1. **Verify costs** (:func:`measure_verify_costs`): the target alone (``specrt._specrt.OrtModel``) on a warm cache of
   each prompt's length; the median time of one forward over ``n = K + 1`` tokens against one over a single token,
   rolled back to the same ``n_past`` every time. Gives ``c_verify(K) / c_p`` for every K used later.
2. **Main table** (:func:`run_main`): warm-up, then for each repetition and prompt a target-only generation and a
   speculative one, back to back (the order alternates between repetitions), so that machine load hits both alike.
3. **Sweeps** (:func:`run_sweeps`, fewer prompts and tokens): speculative decoding at each K of a K sweep (greedy)
   and at each temperature of a temperature sweep (at the main K), interleaved with a target-only baseline.
4. **Peers** (optional, :mod:`specrt.bench.peers`; the scripts ship in ``specrt/bench/peer_scripts``), each in its
   own process and virtual environment (never needed by specrt itself): onnxruntime-genai on the very same ONNX files,
   Hugging Face transformers assisted generation (torch, CPU) and llama.cpp on the GGUF files the models were
   converted from.

Every timing figure is the median over at least three repetitions, with the min and max beside it. Definitions
(per prompt; ms = milliseconds of wall time):

- ``decode_tokens_per_s`` = emitted tokens / (wall time of ``generate`` - ``prefill_ms``); ``tokens_per_s`` =
  emitted tokens / wall time (prefill included, as the peers report it).
- ``speedup`` = speculative ``decode_tokens_per_s`` / target-only ``decode_tokens_per_s``, paired per repetition;
  ``e2e_speedup`` the same with prefill included.
- ``acceptance_rate`` = accepted / drafted (vLLM's definition); ``mean_tokens_per_round`` E = emitted / rounds;
  ``alpha_fit`` = the per-token a whose geometric model (1 - a^(K+1)) / (1 - a) gives E (the seed's a; a different
  quantity from accepted / drafted).
- ``c_q_ms`` = draft ms per draft pass (``draft_ms / n_drafted`` of the speculative run); ``c_p_ms`` = target-only
  decode ms per emitted token (everything a target-only step costs: forward, sampling, bookkeeping).
- ``c_verify_ratio`` = c_verify(K) / c_p from step 1; ``predicted_speedup`` = ``speedup(alpha_fit, K, c_q, c_p,
  c_verify=c_verify_ratio * c_p)`` = c_p E / (K c_q + c_verify(K)); ``measured_over_predicted`` = speedup /
  predicted_speedup. Since alpha_fit reproduces E, measured / predicted is (K c_q + c_verify(K)) / (measured ms per
  round): ``round_ms`` splits the measured round into draft, target and other (verification, Python) ms to show
  which term departs.

**Suites** (``suite``, ``specrt bench --suite spec-bench``; :mod:`specrt.bench.spec_bench`): instead of steps 1-3,
Spec-Bench's questions (480 in 13 categories, shipped in the package) through the target's chat template, with
target-only, the draft model, prompt lookup, prompt lookup + draft and auto K on every turn of every question, and
per category and overall: decode tokens/s, speedup over target-only (median over questions of the paired
per-question ratio), tokens per round, acceptance rate and outputs equal to target-only token for token; a PNG of the
speedups; the peers on the same turns.

Timings depend on machine load: ``machine.load_avg_start`` / ``load_avg_end`` are recorded and the table warns when
the machine was busy.

**CUDA** (``provider="cuda"``, ``specrt bench --provider cuda``): every model the bench loads runs on the GPU, fp16
(registry names are pulled as fp16 unless ``dtype`` says otherwise), and t(n), the target's forward over n tokens, is
measured for n = 1..16 (``verify_ns``). Without a usable CUDA provider the run stops before any work with
``ProviderError`` (the message names ``pip install 'specrt[cuda]'``).

**Random weights** (``random_shapes``, :mod:`specrt.bench.random_models`): GPU time does not depend on the weight
values, acceptance does. The bench writes random-weight models in the real shapes (``qwen2.5-coder``: the 1.5B target
and 0.5B draft of Qwen2.5-Coder), measures t(n), c_q and c_p on them, and predicts the real pair's speedup over K
from those costs and ``acceptance`` (default :data:`QWEN_CODER_ACCEPTANCE`, measured on the CPU):
``random_weights.prediction`` (:func:`predict_from_acceptance`). It checks the cost model on two synthetic pairs
whose acceptance it measures: the random draft (a ~ 0; ``main``) and the target's own first layers as draft
(acceptance ~1, since the target's layers are scaled down; ``random_weights.full_acceptance``, and the sweeps).

**Checkout or installed** (:func:`checkout_root`, the one place that decides): run from a source checkout (editable
install), reports go to ``benches/out`` and the peer venvs are ``benches/out/venv-<peer>``, as ever; installed from a
wheel, reports go to ``./specrt-bench-out`` and the peer venvs to ``<specrt cache>/bench/venv-<peer>`` (the cache is
``$SPECRT_CACHE_DIR``, else ``~/.cache/specrt``). The prompt file, the peer scripts and their setup scripts ship in the
package either way; ``specrt bench --setup-peer genai|hf|llama.cpp`` sets a peer up where the bench looks for it.
``machine.git_commit`` is recorded from a checkout only; ``machine.specrt_version`` always.

Modules (this package re-exports their public names): ``config`` (:class:`BenchConfig`, validation, paths),
``prompts`` (the prompt file), ``stats`` (statistics of timed runs, the cost model's prediction), ``random_models``
(random-weight models in real shapes), ``runner`` (measuring), ``peers`` (the optional peers), ``report`` (tables),
``plots`` (PNGs), ``spec_bench`` (the Spec-Bench suite), ``cli`` (``specrt bench``).
"""

from __future__ import annotations

from specrt.bench.cli import HELP, add_arguments, config_from_args, run_cli, save
from specrt.bench.config import (
    HF_MODES,
    PEERS,
    PROVIDERS,
    QWEN_CODER_ACCEPTANCE,
    BenchConfig,
    checkout_root,
    default_out_dir,
    default_peer_venv,
    resolve_config,
    validate_config,
)
from specrt.bench.peers import gguf_source, peer_modes, peer_warnings, run_peers, setup_command
from specrt.bench.plots import write_plots
from specrt.bench.prompts import Prompt, default_prompts_path, load_prompts
from specrt.bench.random_models import SHAPE_PAIRS, SHAPES, ensure_random_models
from specrt.bench.report import render_table
from specrt.bench.runner import SCHEMA, check_provider, measure_verify_costs, run_bench, run_main, run_sweeps
from specrt.bench.spec_bench import SUITES, load_questions, run_spec_bench, select_questions
from specrt.bench.stats import predict, predict_from_acceptance, spread

__all__ = [
    "HELP",
    "HF_MODES",
    "PEERS",
    "PROVIDERS",
    "QWEN_CODER_ACCEPTANCE",
    "SCHEMA",
    "SHAPES",
    "SHAPE_PAIRS",
    "SUITES",
    "BenchConfig",
    "Prompt",
    "add_arguments",
    "check_provider",
    "checkout_root",
    "config_from_args",
    "default_out_dir",
    "default_peer_venv",
    "default_prompts_path",
    "ensure_random_models",
    "gguf_source",
    "load_prompts",
    "load_questions",
    "measure_verify_costs",
    "peer_modes",
    "peer_warnings",
    "predict",
    "predict_from_acceptance",
    "render_table",
    "resolve_config",
    "run_bench",
    "run_cli",
    "run_main",
    "run_peers",
    "run_spec_bench",
    "run_sweeps",
    "save",
    "select_questions",
    "setup_command",
    "spread",
    "validate_config",
    "write_plots",
]
