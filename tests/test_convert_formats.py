"""Conversion options beyond plain fp32 GGUF: layer truncation (``num_layers``).

Tiny random-weight GGUFs from ``specrt.convert.tiny``; each test takes well under a second.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from specrt.convert import UnsupportedModelError, convert
from specrt.convert.gguf_reader import GGUFModel
from specrt.convert.reference import reference_logits
from specrt.convert.tiny import write_tiny_gguf

ATOL = 1e-3
IDS = [5, 17, 200, 3, 99, 261, 42, 7, 120, 64, 33, 250]


class Runner:
    """Drive a converted model the way specrt-ort does: one KV OrtValue per layer bound as past AND present, in the
    graph's KV dtype (float32, or float16 for ``dtype="fp16"`` folders)."""

    def __init__(self, folder: Path, max_seq: int = 64) -> None:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = 2
        self.sess = ort.InferenceSession(str(folder / "model.onnx"), so, providers=["CPUExecutionProvider"])
        self.cfg = json.loads((folder / "specrt_config.json").read_text())
        kv_type = {i.name: i.type for i in self.sess.get_inputs()}["past_key_values.0.key"]
        kv_dtype = np.float16 if kv_type == "tensor(float16)" else np.float32
        shape = [1, self.cfg["num_kv_heads"], max_seq, self.cfg["head_dim"]]
        self.kv = {
            f"{i}.{k}": ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, kv_dtype))
            for i in range(self.cfg["num_layers"])
            for k in ("key", "value")
        }

    def __call__(self, ids: list[int], n_past: int) -> np.ndarray:
        """float32 logits ``[len(ids), vocab]`` of ``ids`` on top of the first ``n_past`` cached positions."""
        io = self.sess.io_binding()
        io.bind_cpu_input("input_ids", np.asarray([ids], dtype=np.int64))
        io.bind_cpu_input("attention_mask", np.ones((1, n_past + len(ids)), dtype=np.int64))
        for name, v in self.kv.items():
            io.bind_ortvalue_input(f"past_key_values.{name}", v)
            io.bind_ortvalue_output(f"present.{name}", v)
        io.bind_output("logits")
        self.sess.run_with_iobinding(io)
        out = io.get_outputs()[-1].numpy()[0]
        assert out.dtype == np.float32
        return out.copy()


# ----- layer truncation ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_truncated_model_equals_the_reference_with_fewer_layers(tmp_path: Path, arch: str) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", arch=arch, n_layers=3, tied=arch == "llama", matrix_type="Q8_0")
    folder = convert(g, tmp_path / "L2", num_layers=2, progress=False)
    model = GGUFModel(g)
    want = reference_logits(model, IDS, dataclasses.replace(model.spec(), num_layers=2))
    got = Runner(folder)(IDS, 0)
    assert np.abs(got - want).max() < ATOL * max(1.0, np.abs(want).max() / 10)
    full = reference_logits(model, IDS)
    assert np.abs(full - want).max() > 10 * ATOL  # the third layer really is gone
    cfg = json.loads((folder / "specrt_config.json").read_text())
    assert (cfg["num_layers"], cfg["truncated_from"]) == (2, 3)
    assert "first 2 of 3 decoder blocks" in (folder / "NOTICE").read_text()
    assert "truncated_from" not in json.loads(
        (convert(g, tmp_path / "all", progress=False) / "specrt_config.json").read_text()
    )


@pytest.mark.parametrize("n", [0, 4, -1])
def test_num_layers_out_of_range_names_the_block_count(tmp_path: Path, n: int) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", n_layers=3)
    with pytest.raises(UnsupportedModelError, match=rf"num_layers {n} is invalid.*<= 3"):
        convert(g, tmp_path / "out", num_layers=n, progress=False)
    assert not (tmp_path / "out").exists()
