"""``specrt certify``: a losslessness certificate for the user's own target/draft pair and settings.

Speculative decoding is lossless when every emitted token ``x_t`` is a sample of the target's processed distribution
``p_t`` given the tokens before it (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023, arXiv:2302.01318).
The certificate measures exactly that, at every emitted position (first, later, recovered and bonus tokens of a
round, with penalties over the draft prefix and rollbacks in play):

1. Generate with speculation, with the user's settings, ``runs`` times over the prompts (seeds ``seed, seed+1, ...``).
2. Score each generated sequence with the target alone (teacher forcing, one pass over prompt + output) and process
   each row with the same settings (temperature, top-k, top-p, min-p, penalties over the tokens before it): ``p_t``.
3. Randomised probability integral transform: order the vocabulary by decreasing ``p_t`` (ties by id), let
   ``F_t(x - 1)`` be the mass ranked before ``x``, and ``u_t = F_t(x_t - 1) + U_t p_t(x_t)`` with ``U_t`` uniform.
   Under losslessness the ``u_t`` are independent uniforms on [0, 1] (each is uniform given the past), whatever the
   models. Ordering by probability makes a bias towards or away from likely tokens (a wrong temperature, q used
   where p belongs, a residual from the wrong distribution) move ``u`` the same way at every position, so pooling
   positions adds up the evidence instead of cancelling it.
4. Test the pooled ``u`` for uniformity with the two-sided one-sample Kolmogorov-Smirnov test (statistic
   ``D = sup |F_N(s) - s|``; p-value from the Kolmogorov distribution with Stephens' small-sample correction). The
   certificate fails when the p-value is below ``alpha``.

Power: at ``N`` pooled positions and level ``alpha`` the critical value is ``d_alpha ~ c(alpha) / sqrt(N)``
(``c(0.001) = 1.949``); a sampler whose PIT distribution is off by ``delta`` in sup norm (for a consistent bias:
``delta`` equals the total-variation distance moved across the ordering) fails with probability >= 50% when
``delta >= d_alpha`` and >= 99% when ``delta >= d_alpha + 1.628 / sqrt(N)``. At the defaults (N = 12,000,
alpha = 0.001): 0.0178 and 0.0327.

Pass shapes: the teacher-forced pass computes rows over the whole sequence at once, verification over ``K + 1``
tokens on a cache. For the first run the certificate also replays the generation round by round (the same
``n_past`` and chunks the verifier saw) and reports the largest logit difference ``e`` between the two shapes: it
moves each ``u_t`` by at most ``exp(2 e / T) - 1`` (probabilities change by at most that factor) and ``D`` by at most
as much, which the report compares with ``d_alpha``. In fp32 ``e`` is ~1e-5. In fp16 and int4 the two shapes can
differ by ~1e-2 in logits; the report then says whether that bound stays below a tenth of ``d_alpha``, and if not,
the certificate still runs but flags the result as dominated by kernel differences.

Structured output: with a constraint (``response_format``, ``json_schema``, ``regex``, ``grammar``, ``choice`` among
the settings) ``p_t`` is the target's distribution masked by the constraint after the tokens before ``x_t`` (the
engine's mask and EOS rule, from ``_specrt.ConstraintMasks``) and then processed: what target-only constrained
decoding samples from, which speculation must preserve.

Greedy parity: at temperature 0 the certificate instead (and at any temperature also) checks that speculative
greedy output equals target-only greedy output token for token on the prompts, reporting any first divergence with
the target's top-2 logit gap there.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_PROMPTS",
    "CertifyConfig",
    "CertifyReport",
    "certify",
    "kolmogorov_pvalue",
    "ks_statistic",
    "pit_values",
    "render_report",
]

#: Prompts used when none are given: code, prose and chat-like text (rendered with the chat template if ``chat``).
DEFAULT_PROMPTS = (
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Explain in a few sentences why the sky is blue.",
    "List five countries in Europe and their capitals.",
    "def fibonacci(n):",
    "Write a short story about a robot learning to paint.",
    "What are the main differences between TCP and UDP?",
)


def ks_statistic(u: np.ndarray) -> float:
    """Two-sided one-sample Kolmogorov-Smirnov statistic of ``u`` against Uniform(0, 1): ``sup_s |F_N(s) - s|``."""
    x = np.sort(np.asarray(u, dtype=np.float64))
    n = len(x)
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - x), np.max(x - (i - 1) / n)))


def kolmogorov_pvalue(d: float, n: int) -> float:
    """P(D_n >= d) under the null, from the Kolmogorov distribution with Stephens' correction
    ``lambda = (sqrt(n) + 0.12 + 0.11 / sqrt(n)) d`` (Stephens 1970; Numerical Recipes 3rd ed., 14.3.3):
    ``Q(lambda) = 2 sum_{k>=1} (-1)^(k-1) exp(-2 k^2 lambda^2)``. Accurate to ~1e-3 absolute for n >= 50."""
    if n <= 0:
        raise ValueError(f"n {n} is invalid (expected >= 1)")
    if d <= 0:
        return 1.0
    sn = math.sqrt(n)
    lam = (sn + 0.12 + 0.11 / sn) * d
    if lam < 0.2:
        return 1.0
    total = 0.0
    for k in range(1, 101):
        term = 2 * (-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam)
        total += term
        if abs(term) < 1e-16:
            break
    return min(1.0, max(0.0, total))


def ks_critical(alpha: float, n: int) -> float:
    """The D that has p-value ``alpha`` at ``n`` samples (bisection on :func:`kolmogorov_pvalue`)."""
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if kolmogorov_pvalue(mid, n) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def pit_values(probs: np.ndarray, tokens: Sequence[int], noise: np.ndarray) -> np.ndarray:
    """Randomised PIT values ``u_t = F_t(x_t - 1) + U_t p_t(x_t)`` with the vocabulary ordered by decreasing
    ``p_t`` (ties by id).

    Args:
        probs: ``[n, vocab] float32`` processed target distributions (rows sum to 1).
        tokens: ``[n]`` the emitted token at each row.
        noise: ``[n] float64`` uniforms ``U_t``.

    Returns:
        ``[n] float64`` in [0, 1].
    """
    out = np.empty(len(tokens))
    for t, (row, x) in enumerate(zip(probs, tokens, strict=True)):
        p = row.astype(np.float64)
        px = p[x]
        # Mass ranked strictly before x: larger probability, or equal probability and smaller id.
        before = p[p > px].sum() + p[:x][p[:x] == px].sum()
        total = p.sum()
        out[t] = min(1.0, (before + noise[t] * px) / total)
    return out


@dataclass
class CertifyConfig:
    """What to certify: the pair, the user's settings, and the test's size.

    Attributes:
        target, draft: model folders or registry names (draft ``None`` with ``proposer="ngram"``).
        draft_dtype: the draft name's dtype when it differs from the target's (``Decoder(draft_dtype=...)``; e.g.
            ``"int4"``: a model drafted by its own int4 copy).
        settings: sampling settings passed to ``Decoder.generate`` (temperature, top_k, top_p, min_p,
            repetition_penalty, frequency_penalty, presence_penalty, num_speculative_tokens, proposer,
            prompt_lookup_min/max, coupled) and at most one output constraint (response_format, json_schema,
            regex, grammar, choice: structured output, scored with the constraint's masks).
        prompts: prompt texts (default :data:`DEFAULT_PROMPTS`); ``chat`` renders them as user messages.
        n: pooled positions to test (default 12,000); ``max_new_tokens``: tokens per run (default 128).
        alpha: significance level (default 0.001). ``seed``: first seed (runs use seed, seed + 1, ...).
        parity: also check greedy parity on the prompts (default True).
    """

    target: str
    draft: str | None
    settings: dict[str, Any] = field(default_factory=dict)
    draft_dtype: str | None = None
    prompts: Sequence[str] = DEFAULT_PROMPTS
    chat: bool = False
    n: int = 12_000
    max_new_tokens: int = 128
    alpha: float = 1e-3
    seed: int = 0
    parity: bool = True
    max_seq_len: int = 2048
    fault: str | None = None  # a deliberate sampler fault: tests of the certificate only


@dataclass
class CertifyReport:
    """The certificate's result (``passed`` is what the exit code reports)."""

    passed: bool
    n: int
    runs: int
    ks_statistic: float
    p_value: float
    alpha: float
    critical_d: float
    detectable_shift_50: float
    detectable_shift_99: float
    acceptance_rate: float | None
    mean_tokens_per_round: float | None
    shape_logit_diff: float | None
    shape_u_bound: float | None
    parity: list[dict[str, Any]]
    parity_passed: bool
    settings: dict[str, Any]
    seconds: float
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_PROCESS_KEYS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
)


#: The settings that carry an output constraint (structured output); the parity runs keep them.
_CONSTRAINT_KEYS = ("response_format", "json_schema", "regex", "grammar", "choice")


def _processing(dec: Any, settings: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The processing settings in force, with the model folder's defaults filled in: what the one resolver gives
    ``generate`` (``RequestConfig.sampling``); and the masks of the request's output constraint
    (``_specrt.ConstraintMasks``), None without one."""
    from specrt import _specrt

    config = dec.prepare(prompt=[0], **settings).config
    masks = None
    if config.constraint_kind is not None:
        masks = _specrt.ConstraintMasks(dec.target_path, config, dec.vocab_size)
    return {k: config.sampling[k] for k in _PROCESS_KEYS}, masks


def _rounds(sources: Sequence[str]) -> list[int]:
    """Emitted-token counts of each round: a round ends with its recovered or bonus token."""
    sizes, n = [], 0
    for s in sources:
        n += 1
        if s != "accepted":
            sizes.append(n)
            n = 0
    if n:
        sizes.append(n)  # a round cut by EOS / max_new_tokens inside its accepted block
    return sizes


def _top2_gap(row: np.ndarray) -> float:
    top = np.sort(row)[-2:]
    return float(top[1] - top[0])


def certify(cfg: CertifyConfig, *, progress: Any = None) -> CertifyReport:
    """Run the certificate (see the module docstring).

    Args:
        cfg: the pair, settings and test size.
        progress: optional callable ``progress(done_positions, total_positions)``.

    Returns:
        :class:`CertifyReport`.

    Raises:
        ConfigError: bad settings (as ``Decoder.generate`` raises them), ``n < 100``, ``alpha`` outside (0, 1),
            ``max_new_tokens < 1``, temperature 0 with ``parity`` off.
    """
    from specrt import _specrt
    from specrt._ort import find_ort_library
    from specrt.errors import ConfigError
    from specrt.generate import Decoder, check_request

    if cfg.n < 100:
        raise ConfigError(f"n {cfg.n} is invalid (expected >= 100 pooled positions)")
    if not 0 < cfg.alpha < 1:
        raise ConfigError(f"alpha {cfg.alpha} is invalid (expected 0 < alpha < 1)")
    if cfg.max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens {cfg.max_new_tokens} is invalid (expected >= 1 tokens per run)")
    settings = dict(cfg.settings)
    extra = {"_fault": cfg.fault} if cfg.fault else {}
    # The settings are checked before the models load (pulling and converting can take minutes).
    check_request("certify", has_draft=cfg.draft is not None, max_new_tokens=cfg.max_new_tokens, **settings, **extra)
    t0 = time.perf_counter()
    notes: list[str] = []
    dec = Decoder(cfg.target, cfg.draft, max_seq_len=cfg.max_seq_len, draft_dtype=cfg.draft_dtype)
    if progress:
        progress(0, cfg.n)  # the models are loaded; the first run's tokens come next
    processing, masks = _processing(dec, settings)
    greedy = processing["temperature"] == 0
    if greedy and not cfg.parity:
        raise ConfigError(
            "temperature 0 with the parity check off tests nothing (the distribution test needs temperature > 0)"
        )
    prompts = [
        dec.encode(None, [{"role": "user", "content": p}]) if cfg.chat else dec.encode(p, None) for p in cfg.prompts
    ]
    if not prompts:
        raise ConfigError("no prompts given")

    # 1. Generate with speculation until n positions are pooled.
    samples: list[tuple[list[int], list[int], list[str]]] = []
    drafted = accepted = rounds = emitted = 0
    pooled = 0
    run = 0
    max_runs = 20 * math.ceil(cfg.n / cfg.max_new_tokens) + len(prompts)
    while not greedy and pooled < cfg.n and run < max_runs:
        ids = prompts[run % len(prompts)]
        res = dec.generate(ids, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed + run, **settings, **extra)
        samples.append((ids, res.token_ids, res.sources))
        s = res.stats
        drafted, accepted, rounds, emitted = (
            drafted + s.n_drafted,
            accepted + s.n_accepted,
            rounds + s.n_rounds,
            emitted + len(res.token_ids),
        )
        pooled += len(res.token_ids)
        run += 1
        if progress:
            progress(min(pooled, cfg.n), cfg.n)

    # Greedy parity on the prompts (speculative vs target-only, token for token).
    parity: list[dict[str, Any]] = []
    if cfg.parity and (cfg.draft is not None or (settings.get("proposer") or "").startswith("ngram")):
        spec_kw = {k: v for k, v in settings.items() if k in ("num_speculative_tokens", "proposer")}
        spec_kw.update({k: v for k, v in settings.items() if k.startswith("prompt_lookup") or k in _CONSTRAINT_KEYS})
        for ids in prompts:
            kw = {"max_new_tokens": min(cfg.max_new_tokens, 64), "temperature": 0.0}
            kw.update({k: processing[k] for k in ("repetition_penalty", "frequency_penalty", "presence_penalty")})
            cons = {k: v for k, v in settings.items() if k in _CONSTRAINT_KEYS}
            ref = dec.generate(ids, proposer="none", num_speculative_tokens=0, **kw, **cons).token_ids
            out = dec.generate(ids, **spec_kw, **kw, **extra).token_ids
            entry: dict[str, Any] = {"prompt_tokens": len(ids), "tokens": len(ref), "identical": out == ref}
            if out != ref:
                i = next((j for j, (a, b) in enumerate(zip(out, ref, strict=False)) if a != b), min(len(out), len(ref)))
                entry["first_divergence"] = i
                entry["prefix"] = ids + ref[:i]
            parity.append(entry)
    target_path = dec.target_path
    del dec  # free both sessions before loading the scoring one (peak memory: one copy of the target)
    gc.collect()

    # 2. Teacher-forced scoring with the target alone; 3. PIT.
    model = _specrt.OrtModel(target_path, ort_library=find_ort_library(), max_seq_len=cfg.max_seq_len)
    for entry in parity:
        if "prefix" in entry:
            row = np.asarray(model.forward(np.asarray(entry.pop("prefix")), 0, 1))[0]
            entry["top2_logit_gap"] = _top2_gap(row)
    rng = np.random.default_rng([cfg.seed, 0x5EC])
    us: list[np.ndarray] = []
    shape_diff: float | None = None
    for r, (ids, out, sources) in enumerate(samples):
        if not out:
            continue
        seq = np.asarray(ids + out[:-1])
        # [len(out), vocab] raw target rows scoring each emitted token.
        rows = np.asarray(model.forward(seq, 0, len(out)))
        if r == 0:
            shape_diff = _replay_diff(model, ids, out, sources, rows)
        if masks is not None:
            # [len(out), vocab] bool: the constraint's mask of each position (EOS rule included), applied to the raw
            # logits as the engine applies it (before processing; penalties keep -inf at -inf).
            rows = np.where(masks.masks(out), rows, np.float32(-np.inf))
        probs = np.stack(
            [
                _specrt.process_logits(
                    np.ascontiguousarray(rows[t]), **processing, prompt_tokens=ids, output_tokens=out[:t]
                )
                for t in range(len(out))
            ]
        )
        us.append(pit_values(probs, out, rng.random(len(out))))
    u = np.concatenate(us) if us else np.zeros(0)
    n = len(u)
    if not greedy and n < cfg.n:
        notes.append(f"only {n} positions pooled (fewer than n = {cfg.n}): runs ended early at EOS")
    d = ks_statistic(u) if n else 0.0
    p_value = kolmogorov_pvalue(d, n) if n else 1.0
    crit = ks_critical(cfg.alpha, max(n, 1))
    u_bound = None
    if shape_diff is not None and processing["temperature"] > 0:
        u_bound = math.expm1(2 * shape_diff / processing["temperature"])
        if u_bound > crit / 10:
            notes.append(
                f"pass shapes differ by {shape_diff:.2e} in logits, moving u by up to {u_bound:.2e}: more than a "
                f"tenth of the critical D {crit:.4f}; the result may reflect kernel differences (fp16 / int4)"
            )
    if greedy:
        notes.append("temperature 0: the distribution test does not apply (p is a point mass); greedy parity only")
    parity_passed = all(e["identical"] for e in parity)
    passed = (greedy or (n > 0 and p_value >= cfg.alpha)) and parity_passed
    return CertifyReport(
        passed=passed,
        n=n,
        runs=len(samples),
        ks_statistic=d,
        p_value=p_value,
        alpha=cfg.alpha,
        critical_d=crit,
        detectable_shift_50=crit,
        detectable_shift_99=crit + 1.628 / math.sqrt(max(n, 1)),
        acceptance_rate=accepted / drafted if drafted else None,
        mean_tokens_per_round=emitted / rounds if rounds else None,
        shape_logit_diff=shape_diff,
        shape_u_bound=u_bound,
        parity=parity,
        parity_passed=parity_passed,
        settings={**processing, **{k: v for k, v in settings.items() if k not in processing}},
        seconds=time.perf_counter() - t0,
        notes=notes,
    )


def _replay_diff(model: Any, ids: list[int], out: list[int], sources: Sequence[str], rows: np.ndarray) -> float:
    """Largest |logit difference| between the teacher-forced rows and the same rows computed as the engine computes
    them: the first from the prompt's prefill (its last row), then round by round (the chunks and ``n_past`` of
    verification: the last committed token then the round's emitted tokens but the last)."""
    seq = ids + out
    first = np.asarray(model.forward(np.asarray(ids), 0, 1))
    worst = float(np.abs(first[-1] - rows[0]).max())
    start = len(ids) + 1  # index in seq of the round's first emitted token
    for size in _rounds(sources[1:]):
        chunk = np.asarray(seq[start - 1 : start - 1 + size])
        got = np.asarray(model.forward(chunk, start - 1, size))
        ref = rows[start - len(ids) : start - len(ids) + size]
        worst = max(worst, float(np.abs(got - ref).max()))
        start += size
    return worst


def render_report(r: CertifyReport) -> str:
    """A short text report."""
    verdict = "PASSED" if r.passed else "FAILED"
    lines = [f"losslessness certificate: {verdict}"]
    if r.n:
        lines += [
            f"  pooled positions N = {r.n} from {r.runs} runs; settings: "
            + ", ".join(f"{k}={v}" for k, v in r.settings.items()),
            f"  Kolmogorov-Smirnov D = {r.ks_statistic:.4f}, p-value = {r.p_value:.3g} (fails below alpha = {r.alpha});"
            f" critical D = {r.critical_d:.4f}",
            f"  detects a consistent shift of the PIT distribution >= {r.detectable_shift_50:.4f} (50% power), "
            f">= {r.detectable_shift_99:.4f} (99% power)",
        ]
    if r.acceptance_rate is not None:
        lines.append(f"  acceptance rate {r.acceptance_rate:.3f}, mean tokens per round {r.mean_tokens_per_round:.2f}")
    if r.shape_logit_diff is not None:
        bound = f", moves u by <= {r.shape_u_bound:.2e}" if r.shape_u_bound is not None else ""
        lines.append(
            f"  teacher-forced vs verification-shaped passes: max |logit diff| {r.shape_logit_diff:.2e}{bound}"
        )
    if r.parity:
        same = sum(e["identical"] for e in r.parity)
        lines.append(f"  greedy parity: {same}/{len(r.parity)} prompts identical to target-only")
        for e in r.parity:
            if not e["identical"]:
                lines.append(
                    f"    divergence at token {e['first_divergence']}, top-2 logit gap {e.get('top2_logit_gap', 0):.4f}"
                )
    lines.extend(f"  note: {n}" for n in r.notes)
    lines.append(f"  time {r.seconds:.1f} s")
    return "\n".join(lines)
