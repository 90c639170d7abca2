"""NumPy reference sampler and verifier: the test oracle for the Rust core (``rust/specrt-core``).

Short and obviously correct rather than fast. It follows the exact definitions of ``sampling/`` / ``verify.rs``
(float32 logits, float64 sums, the same random draws in the same order), and numpy's ``PCG64`` is the twin of the
Rust ``Pcg64``, so for the same seed the Rust functions and these give the same tokens draw for draw (up to
last-ulp differences of ``exp``, which flip a token with probability ~1e-7 per draw).

Sources: Leviathan et al. 2023 (arXiv:2211.17192), Algorithm 1; Chen et al. 2023 (arXiv:2302.01318), Algorithm 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "DEFAULT_STREAM",
    "Params",
    "Processed",
    "RefVerification",
    "coupled_choice",
    "coupled_uniforms",
    "numpy_generator",
    "pcg_state_from_seed",
    "process",
    "sample",
    "verify",
]

_MASK64 = (1 << 64) - 1
_MASK128 = (1 << 128) - 1
_PCG_MULT = 0x2360_ED05_1FC6_5DA4_4385_DF64_9FCC_F645
#: PCG's default stream, used by ``specrt.Rng(seed)``.
DEFAULT_STREAM = 0x0A02_BDBF_7BB3_C0A7_AC28_FA16_A64A_BF96
_EXP_FLOOR = np.float32(-87.0)  # weights below e^-87 (relative to the top token) are 0, as in Rust
_MIN_TEMPERATURE = 1e-5


def _splitmix64(x: int) -> tuple[int, int]:
    x = (x + 0x9E37_79B9_7F4A_7C15) & _MASK64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & _MASK64
    return x, z ^ (z >> 31)


def pcg_state_from_seed(seed: int) -> tuple[int, int]:
    """The ``(state, inc)`` of ``specrt.Rng(seed)``: splitmix64 twice, then ``rand_pcg::Pcg64::new(hi << 64 | lo,
    DEFAULT_STREAM)``."""
    x, lo = _splitmix64(seed & _MASK64)
    _, hi = _splitmix64(x)
    inc = ((DEFAULT_STREAM << 1) | 1) & _MASK128
    state = ((((hi << 64) | lo) + inc) * _PCG_MULT + inc) & _MASK128
    return state, inc


def numpy_generator(state: int, inc: int) -> np.random.Generator:
    """A numpy ``Generator(PCG64)`` at ``(state, inc)``: its ``random()`` equals ``specrt.Rng.random()``."""
    bg = np.random.PCG64()
    bg.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc}, "has_uint32": 0, "uinteger": 0}
    return np.random.Generator(bg)


@dataclass(frozen=True)
class Params:
    """Sampling parameters (same meaning and defaults as the Rust ``SamplingParams``)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature < _MIN_TEMPERATURE


@dataclass
class Processed:
    """A processed row: ``p[i] = (w[i] >= threshold ? w[i] : 0) / total``."""

    w: np.ndarray  # [vocab] float32 weights exp((x - max) / T), top weight exactly 1
    threshold: np.float32
    total: float  # float64 sum of the kept weights

    def kept(self) -> np.ndarray:
        # [vocab] float32
        return np.where(self.w >= self.threshold, self.w, np.float32(0))

    def prob(self, token: int) -> float:
        return float(self.w[token]) / self.total if self.w[token] >= self.threshold else 0.0

    def probs(self) -> np.ndarray:
        """[vocab] float32 normalised probabilities (as Rust ``write_probs``)."""
        return self.kept() * np.float32(1.0 / self.total)


def _penalise(x: np.ndarray, p: Params, prompt: list[int], output: list[int]) -> np.ndarray:
    if p.repetition_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0:
        return x
    x = x.copy()
    counts: dict[int, int] = {}
    for t in output:
        counts[t] = counts.get(t, 0) + 1
    r, f, pr = np.float32(p.repetition_penalty), np.float32(p.frequency_penalty), np.float32(p.presence_penalty)
    for t in set(prompt) | set(counts):
        if r != 1.0:
            x[t] = x[t] * r if x[t] < 0 else x[t] / r
        if counts.get(t, 0) > 0:
            x[t] = x[t] - (np.float32(counts[t]) * f + pr)
    return x


def _check_finite(x: np.ndarray, row: int) -> None:
    bad = np.flatnonzero(np.isnan(x) | (x == np.inf))
    if bad.size:
        raise ValueError(f"non-finite logits at row {row}, token {bad[0]}")
    if np.all(x == -np.inf):
        raise ValueError(f"non-finite logits at row {row}, token 0: all -inf")


def process(logits: np.ndarray, p: Params, prompt: list[int] = (), output: list[int] = (), row: int = 0) -> Processed:
    """Penalties, temperature, top-k, top-p, min-p of one ``[vocab] float32`` row (greedy: one-hot argmax)."""
    x = _penalise(np.asarray(logits, dtype=np.float32), p, list(prompt), list(output))
    _check_finite(x, row)
    if p.greedy:
        w = np.zeros_like(x)
        w[np.argmax(x)] = 1.0
        return Processed(w, np.float32(0), 1.0)
    m = x.max()
    kth = np.float32(-np.inf)
    if 0 < p.top_k < x.size:
        kth = np.partition(x, x.size - p.top_k)[x.size - p.top_k]  # k-th largest logit; ties kept
    s = (x - m) * (np.float32(1.0) / np.float32(p.temperature))
    with np.errstate(under="ignore", invalid="ignore"):
        w = np.where((s < _EXP_FLOOR) | (x < kth), np.float32(0), np.exp(np.maximum(s, _EXP_FLOOR)))
    w = w.astype(np.float32)
    total = float(w.sum(dtype=np.float64))
    thr = np.float32(0)
    if p.top_p < 1.0:
        desc = np.sort(w.astype(np.float64))[::-1]
        reached = np.flatnonzero(np.cumsum(desc) >= p.top_p * total)
        if reached.size:  # walk descending until the mass reaches top_p; keep every token tied with the last one
            thr = np.float32(desc[reached[0]])
            total = float(w[w >= thr].sum(dtype=np.float64))
    if p.min_p > 0.0 and np.float32(p.min_p) > thr:
        thr = np.float32(p.min_p)  # p >= min_p * p_max  <=>  w >= min_p (top weight is 1)
        total = float(w[w >= thr].sum(dtype=np.float64))
    return Processed(w, thr, total)


def _inverse_cdf(weights: np.ndarray, total: float, u: float) -> int:
    """First index whose running float64 sum exceeds ``u * total`` (never a zero weight)."""
    cum = np.cumsum(weights.astype(np.float64))
    i = int(np.searchsorted(cum, u * total, side="right"))
    if i >= weights.size:  # round-off: the last kept token
        i = int(np.flatnonzero(weights > 0)[-1])
    return i


def sample(
    logits: np.ndarray, p: Params, gen: np.random.Generator | None, prompt: list[int] = (), output: list[int] = ()
) -> int:
    """One token from a row (greedy draws nothing)."""
    pr = process(logits, p, prompt, output)
    if p.greedy:
        return int(np.argmax(pr.w))
    return _inverse_cdf(pr.kept(), pr.total, gen.random())


def sample_draft(
    logits: np.ndarray, p: Params, gen: np.random.Generator | None, prompt: list[int] = (), output: list[int] = ()
) -> tuple[int, np.ndarray]:
    """The draft's step: the token and the ``[vocab] float32`` row ``q`` it was sampled from."""
    q = process(logits, p, prompt, output).probs()
    if p.greedy:
        return int(np.argmax(q)), q
    return _inverse_cdf(q, float(q.sum(dtype=np.float64)), gen.random()), q


@dataclass
class RefVerification:
    """Result of ``verify``: ``tokens`` = accepted drafts then one recovered or bonus token."""

    n_accepted: int
    tokens: list[int]
    last: str  # "recovered" | "bonus"


def verify(
    target_logits: np.ndarray,
    draft_probs: np.ndarray | None,
    draft_tokens: list[int],
    p: Params,
    gen: np.random.Generator | None,
    mode: str = "stochastic",
    prompt: list[int] = (),
    output: list[int] = (),
) -> RefVerification:
    """One round. ``target_logits``: [k + 1, vocab] float32; ``draft_probs``: [k, vocab] float32 (stochastic mode).

    Draws: one uniform per evaluated draft position, then one for the recovered or bonus token; none when greedy.
    """
    out = list(output)
    tokens: list[int] = []
    for i, d in enumerate(draft_tokens):
        pr = process(target_logits[i], p, prompt, out, row=i)
        if p.greedy:
            a = int(np.argmax(pr.w))
            if a != d:
                return RefVerification(i, [*tokens, a], "recovered")
        else:
            q = float(draft_probs[i, d]) if mode == "stochastic" else 1.0
            if gen.random() * q >= pr.prob(d):  # reject with probability 1 - min(1, p/q)
                u = gen.random()
                if mode == "stochastic":
                    p32 = pr.kept() * np.float32(1.0 / pr.total)
                    resid = np.maximum(p32 - draft_probs[i], np.float32(0))  # max(0, p - q)
                else:
                    resid = pr.kept().copy()
                    resid[d] = 0  # p with d removed
                mass = float(resid.sum(dtype=np.float64))
                # Zero residual mass only through round-off (rejection probability 0): sample p instead.
                if mode == "stochastic" and mass < np.finfo(np.float32).tiny:
                    return RefVerification(i, [*tokens, _inverse_cdf(pr.kept(), pr.total, u)], "recovered")
                if mode != "stochastic" and (mass <= 0 or mass < pr.total * np.finfo(np.float32).eps * 1e-3):
                    return RefVerification(i, [*tokens, _inverse_cdf(pr.kept(), pr.total, u)], "recovered")
                return RefVerification(i, [*tokens, _inverse_cdf(resid, mass, u)], "recovered")
        tokens.append(int(d))
        out.append(int(d))
    k = len(draft_tokens)
    return RefVerification(k, [*tokens, sample(target_logits[k], p, gen, prompt, out)], "bonus")


# ----- coupled sampling (twin of rust/specrt-core/src/coupled.rs) ---------------------------------------------------
_GAMMA = 0x9E37_79B9_7F4A_7C15


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on a uint64 array (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58_476D_1CE4_E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D0_49BB_1331_11EB)
    return z ^ (z >> np.uint64(31))


def coupled_uniforms(seed: int, position: int, vocab: int) -> np.ndarray:
    """``[vocab] float64`` in (0, 1]: the coupled noise ``u_{position, i}`` of ``seed`` for every token id ``i``.

    SplitMix64 at counter ``(position << 32) | i`` of the stream keyed by ``mix64(seed + gamma)``;
    ``u = ((z >> 11) + 1) * 2^-53``.
    """
    key = _mix64(np.array([(seed + _GAMMA) & _MASK64], dtype=np.uint64))[0]
    counter = (np.uint64(position) << np.uint64(32)) | np.arange(vocab, dtype=np.uint64)
    z = _mix64(key + (counter + np.uint64(1)) * np.uint64(_GAMMA))
    return ((z >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0**-53


def coupled_choice(weights: np.ndarray, seed: int, position: int) -> int:
    """The coupled choice from ``[vocab]`` non-negative weights: ``argmin_i -ln(u_i) / w_i`` over ``w_i > 0``
    (an exponential race, i.e. the Gumbel-max trick), lowest id on ties."""
    w = np.asarray(weights, dtype=np.float64)
    u = coupled_uniforms(seed, position, len(w))
    with np.errstate(divide="ignore"):
        ratio = np.where(w > 0, -np.log(u) / np.where(w > 0, w, 1.0), np.inf)
    return int(np.argmin(ratio))
