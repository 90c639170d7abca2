"""The cost model of speculative decoding (implemented in Rust, ``rust/specrt-core/src/cost.rs``).

Terms: ``a`` per-token acceptance rate of the geometric model, ``k`` draft tokens per round, ``c_q`` / ``c_p`` the
cost of one draft / target pass, ``c_verify`` the cost of the target pass verifying ``k`` drafts (default ``c_p``).

- ``acceptance_prob(p, q)`` = min(1, p/q)
- ``expected_tokens(a, k)`` = (1 - a**(k+1)) / (1 - a)  (k + 1 at a = 1)
- ``cycle_cost(k, c_q, c_p, c_verify=None)`` = k c_q + c_verify
- ``speedup(a, k, c_q, c_p, c_verify=None)`` = c_p E / (k c_q + c_verify)
- ``optimal_k(a, c_q, c_p, *, k_max=64, c_verify=None)`` exact integer search (K = 0 = don't speculate);
  ``c_verify`` may be a callable or a table indexed by K
- ``compare_drafts(a_a, c_q_a, a_b, c_q_b, *, k, c_p, c_verify=None)``
- ``alpha_from_tokens_per_round(e, k)``: the ``a`` whose geometric model gives a measured mean tokens per round
  (not vLLM's accepted / drafted ratio)

Example from the seed: a = 0.7, c_q = 1, c_p = 10 gives the best speedup at K = 4 (1.981x), not "around 5-6" as the
seed says.
"""

from specrt._specrt import (
    DraftComparison,
    OptimalK,
    acceptance_prob,
    alpha_from_tokens_per_round,
    compare_drafts,
    cycle_cost,
    expected_tokens,
    optimal_k,
    speedup,
)

__all__ = [
    "DraftComparison",
    "OptimalK",
    "acceptance_prob",
    "alpha_from_tokens_per_round",
    "compare_drafts",
    "cycle_cost",
    "expected_tokens",
    "optimal_k",
    "speedup",
]
