"""llama.cpp's fp32 logits of a GGUF over steps on one KV cache, for tests/convert/test_llama_cpp_oracle.py.

Runs in the llama-cpp-python venv that benches/peers/setup_llama_cpp_python.sh builds (a subprocess of the test,
which never imports llama_cpp itself):

    <venv>/bin/python tests/convert/llama_cpp_worker.py REQUEST.json OUT.npz

REQUEST.json: ``{"model": "<gguf path>", "n_ctx": 64, "steps": [{"n_past": 0, "tokens": [5, 17, ...]}, ...]}``.
Each step keeps the first ``n_past`` positions of the cache, removes the rest (``llama_memory_seq_rm``: a rollback
when ``n_past`` is below the positions evaluated so far) and evaluates ``tokens`` at positions ``n_past ...`` in one
batch. OUT.npz: ``step0``, ``step1``, ... float32 ``[len(tokens), n_vocab]``, the logits of every token of each step.

With ``"texts": [...]`` and ``"greedy": n`` instead of ``steps``: each text is tokenized as llama.cpp does for the
model (``llama_tokenize`` with its BOS, no special-token parsing) and run from an empty cache; OUT.npz holds
``tokens{i}`` (int64 ids), ``logits{i}`` (float32 ``[len(tokens), n_vocab]``, the prompt's) and ``greedy{i}`` (the
``n`` tokens greedy decoding appends, each the first maximum of its logits).

The context runs llama.cpp's fp32 path: an F32 KV cache (``type_k = type_v = GGML_TYPE_F32``; the default is F16),
flash attention off, one thread, the CPU backend; F32 weights are multiplied in F32 (``vec_dot_type`` F32).
"""

from __future__ import annotations

import json
import sys


def main(request_path: str, out_path: str) -> None:
    import llama_cpp
    import numpy as np

    with open(request_path, encoding="utf-8") as f:
        req = json.load(f)
    n_ctx = int(req["n_ctx"])
    llm = llama_cpp.Llama(
        model_path=req["model"],
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_ubatch=n_ctx,
        n_threads=int(req.get("threads", 1)),
        n_threads_batch=int(req.get("threads", 1)),
        n_gpu_layers=0,
        logits_all=True,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
        flash_attn=False,
        seed=0,
        verbose=False,
    )
    out = {}
    for i, text in enumerate(req.get("texts", [])):
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        llm.reset()
        llm.eval(tokens)
        out[f"tokens{i}"] = np.array(tokens, dtype=np.int64)
        out[f"logits{i}"] = np.array(llm.scores[: len(tokens)], dtype=np.float32)
        greedy = []
        for _ in range(int(req["greedy"])):
            greedy.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([greedy[-1]])
        out[f"greedy{i}"] = np.array(greedy, dtype=np.int64)
    for i, step in enumerate(req.get("steps", [])):
        n_past, tokens = int(step["n_past"]), [int(t) for t in step["tokens"]]
        if n_past > llm.n_tokens:
            raise SystemExit(f"step {i}: n_past {n_past} is beyond the {llm.n_tokens} positions evaluated")
        llm.n_tokens = n_past  # Llama.eval removes positions >= n_tokens from the cache (llama_memory_seq_rm)
        llm.eval(tokens)
        pos_max = llama_cpp.llama_memory_seq_pos_max(llm._ctx.memory, 0)
        if pos_max != n_past + len(tokens) - 1:
            raise SystemExit(f"step {i}: the cache ends at position {pos_max}, not {n_past + len(tokens) - 1}")
        out[f"step{i}"] = np.array(llm.scores[n_past : n_past + len(tokens)], dtype=np.float32)
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(*sys.argv[1:])
