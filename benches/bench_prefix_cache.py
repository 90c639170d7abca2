"""Time to first token of a multi-turn chat with prefix caching on and off (issue 31: turns 2-4 at least 5x lower).

    python benches/bench_prefix_cache.py                                  # SmolLM2-135M fp32, single stream
    python benches/bench_prefix_cache.py --max-batch 2                    # the batched layout (fp32-B), same chat
    python benches/bench_prefix_cache.py --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct
    python benches/bench_prefix_cache.py --json benches/results/prefix-cache.json

A 4-turn chat whose rendered history reaches about 600 tokens by turn 4: a ~340-token first message giving context,
then short questions; answers of ``--max-new-tokens`` greedy tokens, EOS ignored. Each turn's prompt is the whole
history rendered with the model's chat template, so turn n repeats turn n - 1's prompt and its answer (as far as re-
tokenizing the answer's text gives the generated ids again). The chat runs ``--repeats`` times on one Decoder with
prefix caching and on one without (interleaved, after a warm-up chat on each; each chat's first message is new, so
turn 1 reuses at most the template's default system prompt). TTFT is the wall time from calling ``Decoder.stream`` to
its first chunk (prefill plus the first round). Reports per turn: prompt tokens, reused tokens, median TTFT on and off
and their ratio; and whether both decoders gave the same token ids.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import specrt

PARAGRAPH = (
    "Here is some context about the project I am working on. It is a small web service written in Python that "
    "stores notes for a team, with a database of users, notes and tags, a search page, an export to Markdown and a "
    "nightly backup job. The service has grown over three years and the code is hard to change now: tests are "
    "slow, the models are tangled with the views, and deployments fail about once a month for reasons nobody "
    "fully understands. "
)
QUESTIONS = [
    "What would you look at first?",
    "How would you make the tests faster?",
    "How would you untangle the models from the views?",
    "And how would you find out why deployments fail?",
]


def chat(dec: specrt.Decoder, turn_tag: int, max_new_tokens: int, **kwargs: Any) -> list[dict[str, Any]]:
    """One 4-turn chat; ``turn_tag`` makes the first message differ between chats (each chat's turn 1 is a miss)."""
    messages: list[dict[str, str]] = []
    turns = []
    for i, q in enumerate(QUESTIONS):
        content = f"Chat {turn_tag}. " + PARAGRAPH * 3 + q if i == 0 else q
        messages.append({"role": "user", "content": content})
        prompt = dec.apply_chat_template(messages)
        t0 = time.perf_counter()
        ttft = None
        result = None
        for chunk in dec.stream(prompt, max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True, **kwargs):
            if ttft is None:
                ttft = time.perf_counter() - t0
            result = chunk.result
        assert result is not None and ttft is not None
        messages.append({"role": "assistant", "content": result.text})
        turns.append(
            {
                "ttft_s": ttft,
                "n_prompt_tokens": result.stats.n_prompt_tokens,
                "n_cached_tokens": result.stats.n_cached_tokens,
                "token_ids": result.token_ids,
            }
        )
    return turns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--max-batch", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    common = {"dtype": args.dtype, "max_seq_len": args.max_seq_len, "max_batch": args.max_batch}
    decoders = {
        "on": specrt.Decoder(args.target, args.draft, **common),
        "off": specrt.Decoder(args.target, args.draft, prefix_caching=False, **common),
    }
    kwargs = {"num_speculative_tokens": 4} if args.draft else {"num_speculative_tokens": 0}
    for name, dec in decoders.items():
        chat(dec, -1 if name == "on" else -2, args.max_new_tokens, **kwargs)  # warm-up
    runs: dict[str, list[list[dict[str, Any]]]] = {"on": [], "off": []}
    for r in range(args.repeats):
        for name, dec in decoders.items():
            runs[name].append(chat(dec, r, args.max_new_tokens, **kwargs))
    same = all(
        [t["token_ids"] for t in a] == [t["token_ids"] for t in b] for a, b in zip(runs["on"], runs["off"], strict=True)
    )
    rows = []
    for i in range(len(QUESTIONS)):
        on = statistics.median(run[i]["ttft_s"] for run in runs["on"])
        off = statistics.median(run[i]["ttft_s"] for run in runs["off"])
        rows.append(
            {
                "turn": i + 1,
                "n_prompt_tokens": runs["on"][0][i]["n_prompt_tokens"],
                "n_cached_tokens": runs["on"][0][i]["n_cached_tokens"],
                "ttft_on_ms": on * 1000,
                "ttft_off_ms": off * 1000,
                "speedup": off / on,
            }
        )
    print(
        f"{args.target} {args.dtype}"
        + (f" + draft {args.draft}" if args.draft else "")
        + f", max_batch {args.max_batch}"
    )
    print("turn  prompt  reused  TTFT on ms  TTFT off ms  off/on")
    for row in rows:
        print(
            f"{row['turn']:>4}  {row['n_prompt_tokens']:>6}  {row['n_cached_tokens']:>6}  {row['ttft_on_ms']:>10.1f}  "
            f"{row['ttft_off_ms']:>11.1f}  {row['speedup']:>6.1f}x"
        )
    print(f"same token ids with and without prefix caching: {same}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "machine": platform.processor() or platform.machine(),
        }
        args.json.write_text(json.dumps({**out, "turns": rows, "same_tokens": same}, indent=2))


if __name__ == "__main__":
    main()
