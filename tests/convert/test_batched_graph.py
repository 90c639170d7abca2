"""The batched decoder contract (``specrt convert --attention batched``; ARCHITECTURE.md "Batched rounds"): rows of
a batch on their own caches, right-padded to one length, give each row the logits the batch-1 GQA model gives it, in
prefill and in multi-token steps on ragged caches (the runtime keeps the caches and writes each pass's new keys /
values at each row's offset, as the Rust engine will)."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest

from specrt.convert import UnsupportedModelError, convert
from specrt.convert.tiny import write_tiny_gguf

L = 64  # cache capacity per row


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("batched-graph")
    gguf = write_tiny_gguf(root / "t.gguf", arch="qwen2", seed=5, n_layers=2)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    out = {}
    for attention in ("gqa", "batched"):
        folder = convert(gguf, root / attention, progress=False, attention=attention)
        out[attention] = ort.InferenceSession(str(folder / "model.onnx"), so, providers=["CPUExecutionProvider"])
        out[f"{attention}_config"] = json.loads((folder / "specrt_config.json").read_text())
    return out


class Solo:
    """One sequence on the batch-1 GQA model (shared past/present buffer emulated by copying present back)."""

    def __init__(self, sess: ort.InferenceSession, cfg: dict) -> None:
        self.sess, self.n = sess, 0
        shape = (1, cfg["num_kv_heads"], L, cfg["head_dim"])
        self.kv = {
            f"past_key_values.{i}.{k}": np.zeros(shape, np.float32)
            for i in range(cfg["num_layers"])
            for k in ("key", "value")
        }

    def run(self, ids: list[int]) -> np.ndarray:
        feeds = {
            "input_ids": np.array([ids], np.int64),
            "attention_mask": np.ones((1, self.n + len(ids)), np.int64),
            **self.kv,
        }
        outs = self.sess.run(None, feeds)
        names = [o.name for o in self.sess.get_outputs()]
        for name, value in zip(names, outs, strict=True):
            if name.startswith("present."):
                self.kv[name.replace("present.", "past_key_values.")] = value
        self.n += len(ids)
        return outs[names.index("logits")][0]  # [S, vocab]


class Batch:
    """Rows on the batched model; the caches live here and each pass's new K / V are written at each row's length."""

    def __init__(self, sess: ort.InferenceSession, cfg: dict, rows: int) -> None:
        self.sess, self.lens = sess, [0] * rows
        kvh, hd, n = cfg["num_kv_heads"], cfg["head_dim"], cfg["num_layers"]
        self.kt = [np.zeros((rows, kvh, hd, L), np.float32) for _ in range(n)]
        self.v = [np.zeros((rows, kvh, L, hd), np.float32) for _ in range(n)]

    def run(self, ids: list[list[int]], pad: int = 0) -> list[np.ndarray]:
        """Each row's new tokens (ragged; right-padded with ``pad``); returns each row's real logits."""
        s = max(len(r) for r in ids)
        feeds = {
            "input_ids": np.array([r + [pad] * (s - len(r)) for r in ids], np.int64),
            "positions": np.array([[n + j for j in range(s)] for n in self.lens], np.int64),
            "past_lengths": np.array(self.lens, np.int64),
        }
        for i, (kt, v) in enumerate(zip(self.kt, self.v, strict=True)):
            feeds[f"past_key_values.{i}.key_t"], feeds[f"past_key_values.{i}.value"] = kt, v
        names = [o.name for o in self.sess.get_outputs()]
        out = dict(zip(names, self.sess.run(None, feeds), strict=True))
        for b, r in enumerate(ids):
            n, m = self.lens[b], len(r)  # only the real tokens enter the cache
            for i in range(len(self.kt)):
                self.kt[i][b, :, :, n : n + m] = out[f"new.{i}.key"][b, :, :m].transpose(0, 2, 1)
                self.v[i][b, :, n : n + m] = out[f"new.{i}.value"][b, :, :m]
            self.lens[b] += m
        return [out["logits"][b, : len(r)] for b, r in enumerate(ids)]


def test_each_row_equals_its_solo_run(models) -> None:
    cfg = models["gqa_config"]
    assert models["batched_config"]["kv_layout"] == "batched_rows"
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, 200, n)) for n in (5, 9, 2)]
    solo = [Solo(models["gqa"], cfg) for _ in prompts]
    batch = Batch(models["batched"], cfg, len(prompts))
    got = batch.run([[int(t) for t in p] for p in prompts], pad=7)
    for b, p in enumerate(prompts):
        np.testing.assert_allclose(got[b], solo[b].run([int(t) for t in p]), atol=1e-4, rtol=1e-4)
    for step in range(4):  # K + 1 tokens per row, a different count per row in the last steps
        sizes = [3, 3, 3] if step < 2 else [1, 4, 2]
        new = [[int(t) for t in rng.integers(0, 200, k)] for k in sizes]
        got = batch.run(new)
        for b in range(len(prompts)):
            np.testing.assert_allclose(got[b], solo[b].run(new[b]), atol=1e-4, rtol=1e-4)
    # The garbage a padded position writes beyond a row's length is never read: a row that took 1 token above sits
    # next to rows that took 4 and 2, and later steps still match.
    new = [[5, 6], [7, 8], [9, 10]]
    for b, row in enumerate(batch.run(new)):
        np.testing.assert_allclose(row, solo[b].run(new[b]), atol=1e-4, rtol=1e-4)


def test_the_layouts_are_not_mixed_and_max_batch_needs_the_batched_one(tmp_path) -> None:
    import specrt
    from specrt.errors import ConfigError

    gguf = write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2", seed=5, n_layers=1)
    batched = convert(gguf, tmp_path / "m", progress=False, attention="batched")
    gqa = convert(gguf, tmp_path / "g", progress=False)
    with pytest.raises(ConfigError, match=r"not in the batched layout .*kv_layout 'shared_buffer'.*max_batch > 1"):
        specrt.Decoder(gqa, max_batch=2)
    with pytest.raises(ConfigError, match=r"g is not in the batched layout .*share one layout"):
        specrt.Decoder(batched, gqa)
    with pytest.raises(ConfigError, match=r"m is not in the GQA layout .*share one layout"):
        specrt.Decoder(gqa, batched)
    # A batched-layout folder alone runs as a batch of one and gives the GQA decoder's tokens.
    one = specrt.Decoder(batched, max_seq_len=64)
    want = specrt.Decoder(gqa, max_seq_len=64).generate([1, 2, 3], max_new_tokens=12, temperature=0)
    assert one.generate([1, 2, 3], max_new_tokens=12, temperature=0).token_ids == want.token_ids


def test_batched_needs_float32_activations_and_a_known_attention(tmp_path) -> None:
    gguf = write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2", seed=5, n_layers=1)
    with pytest.raises(UnsupportedModelError, match="attention 'batched' needs float32 activations"):
        convert(gguf, tmp_path / "a", progress=False, dtype="fp16", attention="batched")
    with pytest.raises(
        UnsupportedModelError, match=r"attention 'flash' is invalid \(expected one of: 'gqa', 'gqa-graph', 'batched'\)"
    ):
        convert(gguf, tmp_path / "b", progress=False, attention="flash")
