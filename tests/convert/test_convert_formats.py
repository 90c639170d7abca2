"""Conversion beyond plain fp32 GGUF: layer truncation (``num_layers``), int4 / int8 / fp16 graphs, Hugging Face
folders as input.

Tiny random-weight GGUFs from ``specrt.convert.tiny``; each test takes well under a second.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from specrt.convert import (
    ConversionError,
    HFFormatError,
    UnsupportedArchitectureError,
    UnsupportedModelError,
    convert,
)
from specrt.convert.errors import ModelFileError
from specrt.convert.gguf_reader import GGUFModel
from specrt.convert.reference_forward import reference_logits
from specrt.convert.tiny import write_hf_folder, write_tiny_gguf
from specrt.convert.weights import WeightPlan

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


# ----- int4 / int8 / fp16 -------------------------------------------------------------------------------------
def _quantized_reference(g: Path, plan: WeightPlan) -> np.ndarray:
    """The float64 NumPy reference run on the weights the quantized graph really holds (dequantized codes)."""
    model = GGUFModel(g)
    spec = model.spec()
    kinds = {"attn_q": "attn", "attn_k": "attn", "attn_v": "attn", "attn_output": "attn", "ffn_gate": "mlp"}
    kinds |= {"ffn_up": "mlp", "ffn_down": "mlp", "attn_qkv": "attn"}
    # phi3's fused matrices as stored (attn_qkv; ffn_up = gate | up): the converter's parts, joined
    fused = {"attn_qkv": ("attn_q", "attn_k", "attn_v"), "ffn_up": ("ffn_gate", "ffn_up")} if spec.arch.fused else {}
    bits = {"int4": 4, "int8": 8}

    class Quantized(GGUFModel):
        def raw_tensor(self, name: str) -> np.ndarray:  # as stored: the reference applies llama.cpp's rotary
            w = model.raw_tensor(name)
            part = name.split(".")[-2] if name.startswith("blk.") else name
            kind = kinds.get(part) if name.endswith(".weight") else None
            if name == "token_embd.weight":
                kind = "embed"
            elif name == "output.weight":
                kind = "head"
            storage = getattr(plan, kind) if kind else "float"
            if storage == "float":
                return w
            if part in fused:
                names = [name.replace(part, p) for p in fused[part]]
                return np.concatenate([model.block_quant(n, bits[storage], spec).dequantize() for n in names])
            bq = model.block_quant(name, bits[storage], spec)  # half-split rows: permute back
            deq = bq.dequantize()
            if (".attn_q." in name or ".attn_k." in name) and spec.arch.qk_permuted:
                n = spec.num_attention_heads if ".attn_q." in name else spec.num_kv_heads
                d = deq.shape[0] // n
                deq = deq.reshape(n, 2, d // 2, -1).swapaxes(1, 2).reshape(deq.shape)
            return deq

    return reference_logits(Quantized(g), IDS, spec)


QUANT_CASES = [
    pytest.param({"arch": "llama", "tied": False, "matrix_type": "Q4_0", "embed_type": "Q8_0"}, id="llama-q4_0"),
    pytest.param({"arch": "qwen2", "tied": False, "matrix_type": "Q5_0", "embed_type": "Q8_0"}, id="qwen2-q5_0"),
    pytest.param({"arch": "llama", "tied": True, "matrix_type": "Q4_1"}, id="llama-tied-q4_1"),
    pytest.param({"arch": "qwen2", "tied": False, "matrix_type": "F16", "embed_type": "F16"}, id="qwen2-f16"),
]


@pytest.mark.parametrize("kwargs", QUANT_CASES)
@pytest.mark.parametrize("storage", ["int4", "int8"])
def test_quantized_graph_equals_the_reference_on_its_own_weights(tmp_path: Path, kwargs: dict, storage: str) -> None:
    # accuracy_level 1 (fp32 activations): the graph must then compute exactly the reference on the weights it
    # holds; this checks packing, zero points, fused q|k|v / gate|up, head and GatherBlockQuantized.
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, **kwargs)
    plan = WeightPlan(attn=storage, mlp=storage, head=storage, embed=storage, accuracy_level=1)
    folder = convert(g, tmp_path / "q", plan=plan, dtype=f"{storage}", progress=False)
    want = _quantized_reference(g, plan)
    got = Runner(folder)(IDS, 0)
    assert np.abs(got - want).max() < ATOL * max(1.0, np.abs(want).max() / 10)
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def test_exact_gguf_blocks_at_8_bits_reproduce_the_fp32_model(tmp_path: Path) -> None:
    # Q8_0 / Q5_0 / Q4_0 map exactly at 8 bits: with fp32 activations the logits equal the fp32 reference.
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, arch="qwen2", tied=False, matrix_type="Q5_0", embed_type="Q8_0")
    plan = WeightPlan(attn="int8", mlp="int8", head="int8", embed="int8", accuracy_level=1)
    got = Runner(convert(g, tmp_path / "q", plan=plan, dtype="int8", progress=False))(IDS, 0)
    want = reference_logits(GGUFModel(g), IDS)
    assert np.abs(got - want).max() < ATOL


# Tolerances of the cache tests: fp32 kernels over k rows and over one row round differently (~1e-5); fp16 keeps ~3
# decimal digits (logits here reach ~30, so ~0.05); MatMulNBits with int8 activations (accuracy_level 4) quantizes
# each row of activations on its own, so a row's result does not depend on the other rows in the call (observed
# 0.0 here; the budget allows kernel-path changes with the row count).
CACHE_TOL = {"fp32": 1e-4, "fp16": 0.1, "int4": 0.05, "int8": 0.05}


@pytest.mark.parametrize("dtype", ["fp16", "int4", "int8"])
@pytest.mark.parametrize("kwargs", [QUANT_CASES[0], QUANT_CASES[1]])
def test_chunk_on_cache_equals_full_prefill_and_rollback_forgets(tmp_path: Path, kwargs: dict, dtype: str) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, **kwargs)
    folder = convert(g, tmp_path / dtype, dtype=dtype, progress=False)
    tol = CACHE_TOL[dtype]
    full = Runner(folder)(IDS, 0)  # [12, V]
    n, k = 6, 3
    run = Runner(folder)
    np.testing.assert_allclose(run(IDS[:n], 0), full[:n], atol=tol)
    np.testing.assert_allclose(run(IDS[n : n + k + 1], n), full[n : n + k + 1], atol=tol)
    keep_len, alt = n + k + 1 - 2, [1, 2, 3]  # roll back 2 tokens, continue with others
    np.testing.assert_allclose(run(alt, keep_len), Runner(folder)(IDS[:keep_len] + alt, 0)[keep_len:], atol=tol)
    got1 = run([9], keep_len + len(alt))
    np.testing.assert_allclose(got1, Runner(folder)([*IDS[:keep_len], *alt, 9], 0)[-1:], atol=tol)


@pytest.mark.parametrize("kwargs", QUANT_CASES[:2])
def test_fp16_graph_stays_close_to_the_reference(tmp_path: Path, kwargs: dict) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, **kwargs)
    folder = convert(g, tmp_path / "h", dtype="fp16", progress=False)
    got = Runner(folder)(IDS, 0)
    want = reference_logits(GGUFModel(g), IDS)
    # float16 weights/activations: ~1e-3 relative per op; logits up to ~30 here.
    assert np.abs(got - want).max() < 0.02 * max(1.0, np.abs(want).max())
    import onnx

    m = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    ins = {i.name: i.type.tensor_type.elem_type for i in m.graph.input}
    outs = {o.name: o.type.tensor_type.elem_type for o in m.graph.output}
    assert ins["past_key_values.0.key"] == outs["present.0.value"] == onnx.TensorProto.FLOAT16
    assert outs["logits"] == onnx.TensorProto.FLOAT
    cfg = json.loads((folder / "specrt_config.json").read_text())
    assert (cfg["dtype"], cfg["kv_dtype"], cfg["weights"]["dtype"]) == ("fp16", "float16", "fp16")


def test_int4_graph_uses_matmulnbits_everywhere_and_records_the_plan(tmp_path: Path) -> None:
    import onnx

    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, arch="qwen2", tied=False, matrix_type="Q4_0")
    folder = convert(g, tmp_path / "q", dtype="int4", progress=False)
    m = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    ops = [n.op_type for n in m.graph.node]
    assert "MatMul" not in ops and "Gemm" not in ops and "Gather" not in ops
    assert ops.count("MatMulNBits") == 2 * 4 + 1 and ops.count("GatherBlockQuantized") == 1
    nbits = {n.name: {a.name: a.i for a in n.attribute} for n in m.graph.node if n.op_type == "MatMulNBits"}
    assert all(a["bits"] == 4 and a["accuracy_level"] == 4 and a["block_size"] == 32 for a in nbits.values())
    cfg = json.loads((folder / "specrt_config.json").read_text())
    assert cfg["dtype"] == "int4" and cfg["kv_dtype"] == "float32"
    assert cfg["weights"] == {
        "dtype": "fp32",
        "attn": "int4",
        "mlp": "int4",
        "down": None,
        "head": "int4",
        "embed": "int8",
        "accuracy_level": 4,
        "block_size": 32,
    }


def test_quantized_kinds_need_fp32_activations() -> None:
    with pytest.raises(ValueError, match="needs dtype fp32"):
        WeightPlan(dtype="fp16", mlp="int4")
    with pytest.raises(ValueError, match=r"'int3' is invalid"):
        WeightPlan(attn="int3")


# ----- Hugging Face folders ------------------------------------------------------------------------------------
HF_CASES = [
    pytest.param({"arch": "llama", "tied": True, "matrix_type": "Q8_0"}, 1, "F32", id="llama-tied-1shard"),
    pytest.param({"arch": "qwen2", "tied": False, "matrix_type": "Q5_0", "embed_type": "Q8_0"}, 3, "F32", id="qwen2-3"),
    pytest.param({"arch": "qwen2", "tied": True, "matrix_type": "F16", "embed_type": "F16"}, 2, "F16", id="qwen2-f16"),
]


@pytest.mark.parametrize(("kwargs", "shards", "st_dtype"), HF_CASES)
def test_hf_folder_converts_and_matches_the_numpy_reference(
    tmp_path: Path, kwargs: dict, shards: int, st_dtype: str
) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, **kwargs)
    hf = write_hf_folder(g, tmp_path / "hf", shards=shards, dtype=st_dtype)
    folder = convert(hf, tmp_path / "onnx", progress=False)
    want = reference_logits(GGUFModel(g), IDS)
    got = Runner(folder)(IDS, 0)
    # F32 files hold the GGUF's weights exactly; F16 files also round the (float32) norm weights and biases.
    tol = ATOL if st_dtype == "F32" else 0.05
    assert np.abs(got - want).max() < tol * max(1.0, np.abs(want).max() / 10)
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
    cfg = json.loads((folder / "specrt_config.json").read_text())
    gen = json.loads((folder / "generation_config.json").read_text())
    assert cfg["architecture"] == kwargs["arch"] and cfg["tied_embeddings"] == kwargs["tied"]
    assert gen["eos_token_id"] == [263, 261] == cfg["eos_token_ids"]  # generation_config first, then end-of-turn
    assert (gen["temperature"], gen["top_p"]) == (0.7, 0.8)
    assert "<|im_start|>" in (folder / "chat_template.jinja").read_text()
    assert "Hugging Face folder hf" in (folder / "NOTICE").read_text()
    assert len(cfg["source_sha256"]) == 64


def test_hf_bfloat16_is_widened_exactly_and_int4_works_from_hf(tmp_path: Path) -> None:
    from specrt.convert.hf_reader import HFModel

    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, arch="qwen2", tied=False, matrix_type="F32")
    hf = write_hf_folder(g, tmp_path / "hf", dtype="BF16", generation_config={"eos_token_id": 263, "do_sample": False})
    m = HFModel(hf)
    w = GGUFModel(g).tensor("blk.0.ffn_up.weight")
    bf = (w.view(np.uint32) & 0xFFFF0000).view(np.float32)  # truncation = what write_hf_folder stored
    np.testing.assert_array_equal(m.tensor("blk.0.ffn_up.weight"), bf)
    folder = convert(hf, tmp_path / "q", dtype="int4", progress=False)
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["temperature"] == 0.0 and gen["eos_token_id"][0] == 263  # do_sample false -> greedy default
    assert Runner(folder)(IDS, 0).shape == (len(IDS), 265)


def test_hf_folder_missing_a_tensor_names_it(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, arch="qwen2", tied=False)
    hf = write_hf_folder(g, tmp_path / "hf", drop=("model.layers.1.mlp.down_proj.weight",))
    with pytest.raises(HFFormatError, match=r"'model.layers.1.mlp.down_proj.weight' is missing") as e:
        convert(hf, tmp_path / "out", progress=False)
    assert isinstance(e.value, ModelFileError) and isinstance(e.value, ConversionError)
    assert not (tmp_path / "out").exists()


def test_hf_folder_with_a_wrong_shape_names_both_shapes(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, arch="llama", n_heads=4, n_kv_heads=2)
    hf = write_hf_folder(g, tmp_path / "hf")
    cfg = json.loads((hf / "config.json").read_text())
    cfg["num_key_value_heads"] = 1  # k_proj is [2 * 16, 64] in the file
    (hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        HFFormatError, match=r"'model.layers.0.self_attn.k_proj.weight' has shape \[32, 64\], expected \[16, 64\]"
    ):
        convert(hf, tmp_path / "out", progress=False)


def test_hf_folder_missing_files_and_bad_architecture(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1)
    hf = write_hf_folder(g, tmp_path / "hf", shards=2)
    (hf / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(HFFormatError, match=r"lists shard model-00002-of-00002\.safetensors, which is missing"):
        convert(hf, tmp_path / "out", progress=False)
    hf2 = write_hf_folder(g, tmp_path / "hf2")
    (hf2 / "tokenizer.json").unlink()
    with pytest.raises(HFFormatError, match=r"no tokenizer\.json"):
        convert(hf2, tmp_path / "out", progress=False)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    with pytest.raises(UnsupportedArchitectureError, match=r"'gpt_neox'.*llama, mistral, phi3, qwen2, qwen3"):
        convert(tmp_path / "empty", tmp_path / "out", progress=False)
