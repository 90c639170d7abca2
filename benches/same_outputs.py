"""Token ids and log-probabilities of nine fixed requests, as JSON on stdout: run it with two builds' interpreters and
compare the outputs (benches/RESULTS.md, "the one-driver refactor against the build before it").

    .venv/bin/python benches/same_outputs.py > after.json
    /tmp/old/.venv/bin/python benches/same_outputs.py > before.json

Needs SmolLM2-135M fp32 and its int4-P draft in the model cache (``specrt models pull smollm2-135m-instruct``, and
``--dtype int4``)."""

from __future__ import annotations

import json

import specrt
from specrt.models import cache_dir

PROMPTS = ["def quicksort(xs):", "The capital of France is", "Write a haiku about rust."]


def main() -> None:
    folder = cache_dir() / "models" / "smollm2-135m-instruct"
    dec = specrt.Decoder(folder / "fp32", folder / "int4-P", max_seq_len=512)
    out: dict[str, object] = {}
    for i, prompt in enumerate(PROMPTS):
        for k in (0, 4):
            out[f"{i}-greedy-k{k}"] = dec.generate(
                prompt, max_new_tokens=48, temperature=0, num_speculative_tokens=k
            ).token_ids
        r = dec.generate(prompt, max_new_tokens=48, temperature=0.8, seed=11, num_speculative_tokens=3)
        out[f"{i}-seeded"] = [r.token_ids, [round(x, 5) for x in r.logprobs]]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
