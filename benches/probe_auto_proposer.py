"""One Spec-Bench question's first turn with prompt lookup (K = 4) and with ``proposer="auto"`` (auto K), twice each,
on the gguf Qwen2.5-Coder pair: tokens/s, rounds and the rounds per K, to see which matches auto takes and how much
of each it verifies.

    python benches/probe_auto_proposer.py CATEGORY MAX_NEW_TOKENS     # e.g. summarization 96

Figures: benches/RESULTS.md, "Spec-Bench" (the auto proposer after the first run).
"""

import sys

import specrt
from specrt.bench.spec_bench import load_questions

qs = [q for q in load_questions() if q.category == sys.argv[1]][:1]
dec = specrt.Decoder(
    "qwen2.5-coder-1.5b-instruct",
    draft="qwen2.5-coder-0.5b-instruct",
    dtype="gguf",
    max_seq_len=4096,
    prefix_caching=False,
)
msgs = [{"role": "user", "content": qs[0].turns[0]}]
for p, k in [("ngram", 4), ("auto", "auto"), ("ngram", 4), ("auto", "auto")]:
    r = dec.generate(
        messages=msgs, max_new_tokens=int(sys.argv[2]), temperature=0, proposer=p, num_speculative_tokens=k
    )
    s = r.stats
    print(
        p,
        k,
        f"tok/s {s.decode_tokens_per_s:.2f}",
        "rounds",
        s.n_rounds,
        "drafted",
        s.n_drafted,
        "accepted",
        s.n_accepted,
        "by_k",
        getattr(s, "rounds_by_k", None),
        flush=True,
    )
