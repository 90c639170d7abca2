"""``dtype="gguf"``: the GGUF's own quantized blocks, bit for bit, on specrt's ``ai.specrt`` operators.

What the converter writes is checked here without running anything: every matrix initializer (``*.gguf_blocks``,
uint8 ``[N, row_bytes]``) holds the file's stored bytes (llama Q/K rows reordered by an un-permutation written here
independently of the converter's, and checked through dequantization against the reader's float matrix), the node
counts and attributes of ``GgufMatMul`` / ``GgufGather``, the ``ai.specrt`` opset import, a ``Concat`` where a packed
matrix mixes types (Q4_K_M's Q4_K / Q6_K), float32 fallbacks for the types the operators do not run, the tied head
sharing the embedding's initializer, pruned heads, fused (phi3) matrices, the batched and prefill graphs, and the
real SmolLM2-135M (Q4_1) GGUF.

Running the graphs needs the operators, which exist only in specrt's own ONNX Runtime sessions (never
``import onnxruntime`` here: one ONNX Runtime per process). Those tests skip until the binding has
``specrt._specrt.gguf_matmul`` (the Rust operators landed).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from family_checks import FAMILIES
from gguf_checks import needs_gguf_ops
from specrt.convert import (
    GGUF_PLAN,
    UnsupportedModelError,
    convert,
    estimate_output_bytes,
    gguf_fallbacks,
    plan_for,
)
from specrt.convert.gguf_reader import GGUF_OP_TYPES, GGUFModel
from specrt.convert.tiny import write_hf_folder, write_tiny_gguf

#: Sizes every tested type takes (K types need rows of 256): head_dim 64, 2 KV heads.
SHAPE = {"hidden": 256, "ffn": 512, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2}
#: Types gguf-py quantizes (Q4_0 ... Q8_0) or tiny.py draws as random well-formed blocks (the K types).
OP_TYPES = list(GGUF_OP_TYPES)


# ----- reading both sides -------------------------------------------------------------------------------------------
def stored_bytes(gguf_path: Path) -> dict[str, tuple[int, np.ndarray]]:
    """Every 2-D tensor of the GGUF as the file stores it: name -> (GGML type id, uint8 ``[N, row_bytes]``)."""
    import gguf

    reader = gguf.GGUFReader(gguf_path, "r")
    out = {}
    for t in reader.tensors:
        if len(t.shape) == 2:
            n = int(t.shape[1])
            out[t.name] = (int(t.tensor_type), np.array(np.asarray(t.data).view(np.uint8).reshape(n, -1)))
    del reader
    return out


def graph(folder: Path, stem: str = "model") -> tuple[object, dict[str, np.ndarray]]:
    """``(ModelProto without data, initializer name -> array)``, external initializers read from the data file by
    their offsets (nothing through onnx's loader, which would read every float tensor too)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    m = onnx.load(str(folder / f"{stem}.onnx"), load_external_data=False)
    data = np.memmap(folder / f"{stem}.onnx.data", dtype=np.uint8, mode="r")
    inits = {}
    for t in m.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            ext = {e.key: e.value for e in t.external_data}
            off, length = int(ext["offset"]), int(ext["length"])
            dt = helper.tensor_dtype_to_np_dtype(t.data_type)
            inits[t.name] = np.array(data[off : off + length]).view(dt).reshape(tuple(t.dims))
        else:
            inits[t.name] = numpy_helper.to_array(t)
    del data
    return m, inits


def llama_unpermute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's converter permutation (``convert_hf_to_gguf.py``'s ``LlamaModel.permute``:
    ``w.reshape(n_head, 2, d // 2, ...).swapaxes(1, 2)``) by indexing: stored row ``j`` is Hugging Face row
    ``perm[j]``. Written apart from the converter's ``unpermute_rows``, which it checks."""
    n = rows.shape[0]
    perm = np.arange(n).reshape(n_head, 2, n // n_head // 2).swapaxes(1, 2).reshape(n)
    out = np.empty_like(rows)
    out[perm] = rows
    return out


def dequantize(blocks: np.ndarray, ggml_type: int) -> np.ndarray:
    """gguf-py's dequantization of uint8 rows ``[N, row_bytes]`` -> float32 ``[N, K]``."""
    import gguf
    from gguf.quants import dequantize as deq

    return deq(blocks, gguf.GGMLQuantizationType(ggml_type)).astype(np.float32)


def nodes(model: object, op_type: str) -> list:
    return [n for n in model.graph.node if n.op_type == op_type]


def attrs(node: object) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def expected_qkv(stored: dict, i: int, n_heads: int, n_kv: int, permuted: bool) -> list[np.ndarray]:
    q, k, v = (stored[f"blk.{i}.attn_{n}.weight"][1] for n in "qkv")
    if permuted:
        q, k = llama_unpermute(q, n_heads), llama_unpermute(k, n_kv)
    return [q, k, v]


# ----- bit for bit on the tiny models --------------------------------------------------------------------------------
@pytest.mark.parametrize("qtype", OP_TYPES)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_every_matrix_is_the_ggufs_own_bytes(tmp_path: Path, arch: str, qtype: str) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", arch=arch, seed=2, matrix_type=qtype, embed_type=qtype, **SHAPE)
    folder = convert(g, tmp_path / "gguf", dtype="gguf", progress=False)
    stored = stored_bytes(g)
    m, inits = graph(folder)
    tid = GGUF_OP_TYPES[qtype]
    n_layers = SHAPE["n_layers"]

    # Nodes: per layer q|k|v, o, gate|up, down; the head; the embedding. No float matrix anywhere.
    mm, gather = nodes(m, "GgufMatMul"), nodes(m, "GgufGather")
    assert len(mm) == 4 * n_layers + 1 and len(gather) == 1
    assert not nodes(m, "MatMul") and not nodes(m, "Gemm") and not nodes(m, "MatMulNBits") and not nodes(m, "Gather")
    assert {n.domain for n in mm + gather} == {"ai.specrt"}
    assert ("ai.specrt", 1) in [(o.domain, o.version) for o in m.opset_import]
    assert all(attrs(n)["ggml_type"] == tid for n in mm + gather)

    for i in range(n_layers):
        p = f"blk.{i}"
        want = {
            f"{p}.attn_qkv": np.concatenate(expected_qkv(stored, i, 4, 2, arch == "llama")),
            f"{p}.attn_output": stored[f"{p}.attn_output.weight"][1],
            f"{p}.ffn_gate_up": np.concatenate([stored[f"{p}.ffn_{n}.weight"][1] for n in ("gate", "up")]),
            f"{p}.ffn_down": stored[f"{p}.ffn_down.weight"][1],
        }
        for name, rows in want.items():
            got = inits[f"{name}.gguf_blocks"]
            assert got.dtype == np.uint8 and got.shape == rows.shape
            assert got.tobytes() == rows.tobytes(), name  # bit for bit
            (node,) = [n for n in mm if n.name == name]
            assert list(node.input) == [node.input[0], f"{name}.gguf_blocks"]
            k = SHAPE["ffn"] if name.endswith("down") else SHAPE["hidden"]
            assert attrs(node) == {"ggml_type": tid, "K": k, "N": rows.shape[0]}

    # The embedding and the tied head: one initializer, the file's bytes.
    emb = stored["token_embd.weight"][1]
    assert inits["token_embd.gguf_blocks"].tobytes() == emb.tobytes()
    assert list(gather[0].input) == ["token_embd.gguf_blocks", "input_ids"]
    assert attrs(gather[0]) == {"ggml_type": tid, "K": SHAPE["hidden"]}
    (head,) = [n for n in mm if n.name == "lm_head"]
    assert head.input[1] == "token_embd.gguf_blocks" and list(head.output) == ["logits"]
    assert attrs(head) == {"ggml_type": tid, "K": SHAPE["hidden"], "N": emb.shape[0]}
    assert sum(1 for v in inits.values() if v.dtype == np.uint8 and v.tobytes() == emb.tobytes()) == 1

    # Independently of the byte comparison: the blocks dequantize to the reader's (un-permuted) float matrices.
    with GGUFModel(g) as model:
        spec = model.spec()
        q_rows = spec.num_attention_heads * spec.head_dim
        qkv = dequantize(inits["blk.0.attn_qkv.gguf_blocks"], tid)
        np.testing.assert_array_equal(qkv[:q_rows], model.tensor("blk.0.attn_q.weight", spec))
        np.testing.assert_array_equal(qkv[q_rows : q_rows + 128], model.tensor("blk.0.attn_k.weight", spec))
    cfg = json.loads((folder / "specrt_config.json").read_text())
    assert cfg["dtype"] == "gguf" and cfg["weights"]["attn"] == cfg["weights"]["embed"] == "gguf"
    assert "bit for bit" in (folder / "NOTICE").read_text()


def test_parts_of_different_types_give_one_operator_per_run_and_a_concat(tmp_path: Path) -> None:
    """Q4_K_M's mix: attn_v and some ffn_down in Q6_K beside Q4_K (and here an up projection in Q8_0)."""
    types = {"attn_v": "Q6_K", "blk.1.ffn_down": "Q6_K", "ffn_up": "Q8_0"}
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=4, matrix_type="Q4_K", embed_type="Q6_K", matrix_types=types, **SHAPE)
    folder = convert(g, tmp_path / "gguf", dtype="gguf", progress=False)
    stored = stored_bytes(g)
    m, inits = graph(folder)
    mm = {n.name: n for n in nodes(m, "GgufMatMul")}
    concats = {n.name: n for n in nodes(m, "Concat")}
    for i in range(2):
        p = f"blk.{i}"
        q, k, v = expected_qkv(stored, i, 4, 2, True)
        # q|k in Q4_K: one operator on both parts' rows; v in Q6_K: a second one; joined on the last axis.
        assert inits[f"{p}.attn_qkv.0.gguf_blocks"].tobytes() == np.concatenate([q, k]).tobytes()
        assert inits[f"{p}.attn_qkv.1.gguf_blocks"].tobytes() == v.tobytes()
        assert attrs(mm[f"{p}.attn_qkv.0"]) == {"ggml_type": 12, "K": 256, "N": 256 + 128}
        assert attrs(mm[f"{p}.attn_qkv.1"]) == {"ggml_type": 14, "K": 256, "N": 128}
        cat = concats[f"{p}.attn_qkv/concat"]
        assert list(cat.input) == [mm[f"{p}.attn_qkv.0"].output[0], mm[f"{p}.attn_qkv.1"].output[0]]
        assert attrs(cat) == {"axis": -1}
        assert attrs(mm[f"{p}.ffn_gate_up.0"])["ggml_type"] == 12 and attrs(mm[f"{p}.ffn_gate_up.1"])["ggml_type"] == 8
        assert inits[f"{p}.ffn_gate_up.1.gguf_blocks"].tobytes() == stored[f"{p}.ffn_up.weight"][1].tobytes()
        # A single part is a single operator, whatever its type.
        assert attrs(mm[f"{p}.ffn_down"])["ggml_type"] == (14 if i == 1 else 12)
        assert inits[f"{p}.ffn_down.gguf_blocks"].tobytes() == stored[f"{p}.ffn_down.weight"][1].tobytes()
    assert attrs(mm["lm_head"])["ggml_type"] == 14
    assert len(concats) == 4  # two packed matrices per layer, nothing else


def test_types_the_operators_do_not_run_fall_back_to_float32(tmp_path: Path) -> None:
    """F32 k, a Q5_1 down projection and an F16 embedding: float MatMul / Gather / Gemm of the dequantized weights,
    the rest keeps its blocks, and NOTICE names the fallbacks."""
    types = {"attn_k": "F32", "ffn_down": "Q5_1"}
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=6, matrix_type="Q8_0", embed_type="F16", matrix_types=types, **SHAPE)
    folder = convert(g, tmp_path / "gguf", dtype="gguf", progress=False)
    m, inits = graph(folder)
    mm = {n.name: n for n in nodes(m, "GgufMatMul")}
    assert set(mm) == {
        f"blk.{i}.{n}" for i in range(2) for n in ("attn_qkv.0", "attn_qkv.2", "attn_output", "ffn_gate_up")
    }
    with GGUFModel(g) as model:
        spec = model.spec()
        for i in range(2):
            (k,) = [n for n in nodes(m, "MatMul") if n.name == f"blk.{i}.attn_qkv.1"]
            np.testing.assert_array_equal(inits[k.input[1]], model.tensor(f"blk.{i}.attn_k.weight", spec).T)
            (down,) = [n for n in nodes(m, "MatMul") if n.name == f"blk.{i}.ffn_down"]
            np.testing.assert_array_equal(inits[down.input[1]], model.tensor(f"blk.{i}.ffn_down.weight", spec).T)
            assert len(concats := [n for n in nodes(m, "Concat") if n.name == f"blk.{i}.attn_qkv/concat"]) == 1
            assert len(concats[0].input) == 3
        assert gguf_fallbacks(model, spec) == {
            "F16": ["token_embd.weight"],
            "F32": ["blk.0.attn_k.weight", "blk.1.attn_k.weight"],
            "Q5_1": ["blk.0.ffn_down.weight", "blk.1.ffn_down.weight"],
        }
    # The embedding falls back to a float Gather and the tied head to a Gemm on that same initializer.
    (gather,) = [n for n in nodes(m, "Gather") if n.name == "embed"]
    assert gather.input[0] == "token_embd.weight" and not nodes(m, "GgufGather")
    (gemm,) = nodes(m, "Gemm")
    assert gemm.input[1] == "token_embd.weight"
    notice = (folder / "NOTICE").read_text()
    assert "dequantized to float32 instead" in notice and "Q5_1: 2" in notice and "F16: 1" in notice


def test_all_float_gguf_has_no_specrt_operator_or_opset(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=1, matrix_type="F16", embed_type="F32")
    m, _ = graph(convert(g, tmp_path / "gguf", dtype="gguf", progress=False))
    assert not [n for n in m.graph.node if n.domain == "ai.specrt"]
    assert "ai.specrt" not in [o.domain for o in m.opset_import]


def test_untied_and_pruned_heads_are_the_head_blocks_rows(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=3, matrix_type="Q4_0", embed_type="Q8_0", tied=False, **SHAPE)
    stored = stored_bytes(g)
    m, inits = graph(convert(g, tmp_path / "full", dtype="gguf", progress=False))
    (head,) = [n for n in nodes(m, "GgufMatMul") if n.name == "lm_head"]
    assert head.input[1] == "output.gguf_blocks" and attrs(head)["ggml_type"] == 8
    assert inits["output.gguf_blocks"].tobytes() == stored["output.weight"][1].tobytes()
    assert inits["token_embd.gguf_blocks"].tobytes() == stored["token_embd.weight"][1].tobytes()

    ids = list(range(0, 265, 7))
    folder = convert(g, tmp_path / "pruned", dtype="gguf", progress=False, vocab_subset=ids)
    m, inits = graph(folder)
    (head,) = [n for n in nodes(m, "GgufMatMul") if n.name == "lm_head"]
    assert head.input[1] == "lm_head_subset.gguf_blocks" and attrs(head)["N"] == len(ids)
    assert inits["lm_head_subset.gguf_blocks"].tobytes() == stored["output.weight"][1][ids].tobytes()
    out = next(o for o in m.graph.output if o.name == "logits")
    assert out.type.tensor_type.shape.dim[2].dim_value == len(ids)

    # Tied and pruned: a row subset of the embedding's blocks (the embedding keeps all its rows).
    g2 = write_tiny_gguf(tmp_path / "t.gguf", seed=3, matrix_type="Q4_0", embed_type="Q4_1", **SHAPE)
    m, inits = graph(convert(g2, tmp_path / "tied_pruned", dtype="gguf", progress=False, vocab_subset=ids))
    emb = stored_bytes(g2)["token_embd.weight"][1]
    assert inits["lm_head_subset.gguf_blocks"].tobytes() == emb[ids].tobytes()
    assert inits["token_embd.gguf_blocks"].tobytes() == emb.tobytes()


def test_fused_phi3_matrices_are_the_fused_tensors_bytes(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", arch="phi3", seed=2, matrix_type="Q5_0", embed_type="Q8_0", **SHAPE)
    stored = stored_bytes(g)
    _, inits = graph(convert(g, tmp_path / "gguf", dtype="gguf", progress=False))
    for i in range(2):
        assert inits[f"blk.{i}.attn_qkv.gguf_blocks"].tobytes() == stored[f"blk.{i}.attn_qkv.weight"][1].tobytes()
        assert inits[f"blk.{i}.ffn_gate_up.gguf_blocks"].tobytes() == stored[f"blk.{i}.ffn_up.weight"][1].tobytes()


def test_batched_prefill_and_graph_forms_keep_the_blocks(tmp_path: Path) -> None:
    g = write_tiny_gguf(tmp_path / "m.gguf", arch="qwen3", seed=2, matrix_type="Q4_K", embed_type="Q6_K", **SHAPE)
    for attention in ("batched", "gqa"):
        folder = convert(g, tmp_path / attention, dtype="gguf", attention=attention, prefill_graph=True, progress=False)
        cfg = json.loads((folder / "specrt_config.json").read_text())
        assert cfg["prefill_weights"] == cfg["weights"] and cfg["weights"]["mlp"] == "gguf"
        main, main_inits = graph(folder)
        pre, pre_inits = graph(folder, "prefill")
        for m in (main, pre):
            assert len(nodes(m, "GgufMatMul")) == 4 * 2 + 1 and len(nodes(m, "GgufGather")) == 1
            assert not nodes(m, "DynamicQuantizeMatMul")
            # No weight matrix in float: the batched form's own MatMuls are its attention's (q.k, p.v).
            assert all("/mattn/" in n.name for n in nodes(m, "MatMul"))
        assert [str(o) for o in main.graph.output] == [str(o) for o in pre.graph.output]
        blocks = sorted(n for n in main_inits if n.endswith(".gguf_blocks"))
        assert blocks == sorted(n for n in pre_inits if n.endswith(".gguf_blocks"))
        assert all(main_inits[n].tobytes() == pre_inits[n].tobytes() for n in blocks)
    # The graph form: the head's GgufMatMul writes the logits its ArgMax reads.
    m, _ = graph(convert(g, tmp_path / "graph_form", dtype="gguf", attention="gqa-graph", progress=False))
    (head,) = [n for n in nodes(m, "GgufMatMul") if n.name == "lm_head"]
    (argmax,) = nodes(m, "ArgMax")
    assert list(head.output) == ["logits"] and list(argmax.input) == ["logits"]


def test_plan_estimate_and_refusals(tmp_path: Path) -> None:
    assert plan_for("gguf") == GGUF_PLAN and GGUF_PLAN.uses_gguf_blocks and GGUF_PLAN.dtype == "fp32"
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=2, matrix_type="Q4_1", embed_type="Q8_0", **SHAPE)
    folder = convert(g, tmp_path / "gguf", dtype="gguf", progress=False)
    with GGUFModel(g) as model:
        est = estimate_output_bytes(model, model.spec(), dtype="gguf")
    data = (folder / "model.onnx.data").stat().st_size
    assert data <= est <= data + (1 << 20) * (2 + 4) + 4 * 256 * 64  # the file's bytes + the fixed slack
    hf = write_hf_folder(g, tmp_path / "hf")
    with pytest.raises(UnsupportedModelError, match="Hugging Face folder"):
        convert(hf, tmp_path / "from_hf", dtype="gguf", progress=False)
    assert not (tmp_path / "from_hf").exists()


# ----- the real SmolLM2-135M (Q4_1 matrices) -------------------------------------------------------------------------
def check_every_operator_holds_the_files_bytes(g: Path, folder: Path) -> int:
    """Every ``GgufMatMul`` / ``GgufGather`` of ``folder``'s model holds the bytes ``g`` stores for its parts (rows
    concatenated; llama.cpp's permuted q/k rows un-permuted by :func:`llama_unpermute`; fused tensors as stored), and
    its ``ggml_type`` is theirs. Returns the number of operators checked (one run per matrix: no mixed types)."""
    stored = stored_bytes(g)
    m, inits = graph(folder)
    with GGUFModel(g) as model:
        spec = model.spec()
    checked = 0
    for node in nodes(m, "GgufMatMul") + nodes(m, "GgufGather"):
        if node.op_type == "GgufGather":
            parts, blocks = ["token_embd.weight"], inits[node.input[0]]
        elif node.name == "lm_head":
            parts, blocks = (
                ["output.weight" if "output.weight" in stored else "token_embd.weight"],
                inits[node.input[1]],
            )
        else:
            _, layer, proj = node.name.split(".")  # a run of a mixed-type matrix would have a fourth part
            p = f"blk.{layer}"
            fused_qkv, fused_up = f"{p}.attn_qkv.weight" in stored, f"{p}.ffn_gate.weight" not in stored
            parts = {
                "attn_qkv": [f"{p}.attn_qkv.weight"] if fused_qkv else [f"{p}.attn_{n}.weight" for n in "qkv"],
                "attn_output": [f"{p}.attn_output.weight"],
                "ffn_gate_up": [f"{p}.ffn_up.weight"] if fused_up else [f"{p}.ffn_gate.weight", f"{p}.ffn_up.weight"],
                "ffn_down": [f"{p}.ffn_down.weight"],
            }[proj]
            blocks = inits[node.input[1]]
        rows = []
        for part in parts:
            ggml_type, r = stored[part]
            assert ggml_type == attrs(node)["ggml_type"], (node.name, part)
            if spec.arch.qk_permuted and (".attn_q." in part or ".attn_k." in part):
                r = llama_unpermute(r, spec.num_attention_heads if ".attn_q." in part else spec.num_kv_heads)
            rows.append(r)
        assert blocks.dtype == np.uint8 and blocks.tobytes() == np.concatenate(rows).tobytes(), node.name
        checked += 1
    return checked


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_keeps_its_blocks(tmp_path: Path, family: str) -> None:
    """Each family of the converter (family_checks.FAMILIES: Q8_0 matrices, F32 embeddings), as dtype gguf: every
    layer matrix on a GgufMatMul with the file's bytes; the F32 embedding / head fall back to float."""
    g = write_tiny_gguf(tmp_path / "m.gguf", seed=5, **FAMILIES[family])
    folder = convert(g, tmp_path / "gguf", dtype="gguf", progress=False)
    with GGUFModel(g) as model:
        n_layers = model.spec().num_layers
    assert check_every_operator_holds_the_files_bytes(g, folder) == 4 * n_layers


@pytest.mark.model
def test_smollm2_every_supported_matrix_is_the_files_bytes(smollm2_gguf_folder: tuple[Path, Path]) -> None:
    g, folder = smollm2_gguf_folder
    with GGUFModel(g) as model:
        n_layers = model.spec().num_layers
    checked = check_every_operator_holds_the_files_bytes(g, folder)
    assert checked == 4 * n_layers + 2  # the layers' matrices, the head and the embedding
    types = sorted({t for t, _ in stored_bytes(g).values()})
    print(f"SmolLM2 GGML types of its matrices: {types}; {checked} operators bit for bit")
    assert 3 in types  # Q4_1


# ----- running the graphs (needs specrt's operators) --------------------------------------------------------------
def _forward(folder: Path, ids: list[int], n_past: int = 0, model: object = None) -> np.ndarray:
    """Logits ``[len(ids), vocab]`` of ``ids`` on top of ``n_past`` cached positions (specrt's ``OrtModel``)."""
    from specrt._specrt import OrtModel

    model = model or OrtModel(folder, max_seq_len=64)
    return np.asarray(model.forward(np.asarray(ids, np.int64), n_past, len(ids))).copy()


IDS = [5, 9, 3, 44, 120, 7, 260, 33]


#: Half a rounding step's float32 blur, in steps: float32 and float64 activations differ by ~1e-6 of their size, up
#: to 127 steps, so one within ~1e-4 step of a rounding boundary (x / d = n + 1/2) may round to either code.
NEAR_BOUNDARY_STEPS = 1e-3


def reference_with_boundaries(model: GGUFModel, ids: list[int], monkeypatch: pytest.MonkeyPatch) -> tuple:
    """``(int8-activation reference logits, float reference logits, rows holding an activation within
    NEAR_BOUNDARY_STEPS of a rounding boundary)`` (:func:`specrt.convert.reference_forward.reference_logits`)."""
    from specrt.convert import reference_forward as reference

    near: set[int] = set()
    plain = reference.int8_blocks

    def recording(x: np.ndarray, block: int = 32) -> np.ndarray:
        b = x.reshape(*x.shape[:-1], -1, block)
        d = np.abs(b).max(axis=-1, keepdims=True) / 127.0
        steps = np.abs(np.divide(b, d, out=np.zeros_like(b), where=d > 0)).reshape(x.shape)
        near.update(int(r) for r in np.nonzero(np.abs(steps - np.floor(steps) - 0.5) < NEAR_BOUNDARY_STEPS)[0])
        return plain(x, block)

    with monkeypatch.context() as m:
        m.setattr(reference, "int8_blocks", recording)
        want = reference.reference_logits(model, ids, int8_activations=True)
    return want, reference.reference_logits(model, ids), near


def rows_off(got: np.ndarray, want: np.ndarray, tol: float, flip_bound: np.ndarray, near: set[int]) -> list[int]:
    """Rows of ``got`` farther than ``tol`` from ``want``, each checked to be explained by a rounding flip.

    The graph rounds float32 activations to int8, the reference float64 ones: an activation within float32 rounding
    of a rounding boundary may get the neighbouring code on one side, one step from the other's, the size of the
    int8 rounding itself (measured: 0-3 of a tiny run's 8 rows; every such row, or one before it, holds an activation
    within 1e-4 step of a boundary). So a row may be off only if some row at or before it (attention carries a flip
    forward) is in ``near``, and by at most the int8 activations' whole effect on it (``flip_bound``, per row: the
    reference's gap between int8 and float activations); every other row stays within float32 rounding."""
    err = np.abs(got - want).max(axis=-1)
    off = [int(r) for r in np.flatnonzero(err > tol)]
    for r in off:
        assert any(n <= r for n in near), (r, err[r] / tol, sorted(near))
        assert err[r] <= flip_bound[r], (r, err[r], flip_bound[r])
    return off


@needs_gguf_ops
@pytest.mark.parametrize("qtype", OP_TYPES)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gguf_logits_equal_the_numpy_reference_with_int8_activations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: str, qtype: str
) -> None:
    """The gguf form computes exactly "dequantized weights times int8 activations": its logits equal the NumPy
    reference's (float64, the GGUF's weights as stored, llama.cpp's rotary) with every quantized matrix's input
    rounded per block of the type's block length (:func:`specrt.convert.reference_forward.int8_blocks`), within the
    float32 tolerance of the reference tests (family_checks.tolerance; measured 0.0005-0.0024 of it), but for rows a
    rounding flip explains (:func:`rows_off`). A chunk on the cache and a rollback give the one prefill's rows
    exactly (the kernel's rows do not depend on how many rows a pass has)."""
    from family_checks import tolerance
    from specrt._specrt import OrtModel

    g = write_tiny_gguf(tmp_path / "m.gguf", arch=arch, seed=7, matrix_type=qtype, embed_type="Q6_K", **SHAPE)
    folder = convert(g, tmp_path / "gguf", dtype="gguf", progress=False)
    got = _forward(folder, IDS)
    with GGUFModel(g) as model:
        want, ref_float, near = reference_with_boundaries(model, IDS, monkeypatch)
    tol = tolerance(want)
    off = rows_off(got, want, tol, np.abs(want - ref_float).max(axis=-1), near)
    err = float(np.abs(np.delete(got, off, axis=0) - np.delete(want, off, axis=0)).max())
    print(f"{arch} {qtype}: max |gguf - reference with int8 activations| {err / tol:.4f} tolerances; flipped {off}")
    m = OrtModel(folder, max_seq_len=64)
    _forward(folder, IDS[:5], 0, m)
    np.testing.assert_array_equal(_forward(folder, IDS[5:], 5, m), got[5:])
    _forward(folder, [1, 2], 6, m)  # rolled back below
    np.testing.assert_array_equal(_forward(folder, IDS[6:], 6, m), got[6:])


@needs_gguf_ops
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_runs_as_the_reference_with_int8_activations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    """Each family of family_checks (Q8_0 matrices on GgufMatMul; its F32 embedding and head in float) equals the
    NumPy reference with int8 activations, as in the test above (rows off only by rounding flips)."""
    from family_checks import tolerance

    g = write_tiny_gguf(tmp_path / "m.gguf", seed=5, **FAMILIES[family])
    got = _forward(convert(g, tmp_path / "gguf", dtype="gguf", progress=False), IDS)
    with GGUFModel(g) as model:
        want, ref_float, near = reference_with_boundaries(model, IDS, monkeypatch)
    tol = tolerance(want)
    off = rows_off(got, want, tol, np.abs(want - ref_float).max(axis=-1), near)
    err = float(np.abs(np.delete(got, off, axis=0) - np.delete(want, off, axis=0)).max())
    print(f"{family}: max |gguf - reference with int8 activations| {err / tol:.4f} tolerances; flipped {off}")


@needs_gguf_ops
@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0", "Q4_K"])
def test_gguf_logits_are_the_fp32_forms_within_the_int8_activation_gap(tmp_path: Path, qtype: str) -> None:
    """The gguf and fp32 forms hold the same weights (fp32: gguf-py's dequantization of the same blocks), so they
    differ only by the int8 activations. Each rounding moves an activation by at most 1/254 of its block's largest
    |a| (about 0.55% relative RMS per matrix for Gaussian-like blocks: measured 0.53-0.57% on single matrices), and
    how that grows through the layers depends on the network (random tiny weights amplify it several times), so the
    tolerance is derived on the network itself: the NumPy reference's own gap between int8 and float activations
    (float64: nothing else differs; measured: the forms' gap is that gap to 1e-4), twice for a rounding flip, plus the
    float32 tolerance of each form."""
    from family_checks import tolerance
    from specrt.convert.reference_forward import reference_logits

    g = write_tiny_gguf(tmp_path / "m.gguf", seed=7, matrix_type=qtype, embed_type="Q6_K", **SHAPE)
    want = _forward(convert(g, tmp_path / "fp32", progress=False), IDS)
    got = _forward(convert(g, tmp_path / "gguf", dtype="gguf", progress=False), IDS)
    with GGUFModel(g) as model:
        ref_int8, ref_float = reference_logits(model, IDS, int8_activations=True), reference_logits(model, IDS)
    gap = float(np.abs(ref_int8 - ref_float).max())
    tol = 2 * gap + tolerance(ref_int8) + tolerance(ref_float)  # twice: a rounding flip (rows_off) adds up to it
    err = float(np.abs(got - want).max())
    scale = float(np.abs(want).max())
    print(
        f"{qtype}: max |gguf - fp32| {err:.4g} (logits up to {scale:.3g}); the int8 activations' gap {gap:.4g}; "
        f"{err / tol:.3f} of the tolerance"
    )
    assert err <= tol
    assert gap > tolerance(ref_float)  # the forms do differ: the check above is not vacuous


@needs_gguf_ops
@pytest.mark.parametrize("attention", ["gqa", "batched"])
def test_tiny_gguf_greedy_speculation_equals_target_only(tmp_path: Path, attention: str) -> None:
    import specrt

    g = write_tiny_gguf(tmp_path / "m.gguf", seed=8, matrix_type="Q4_K", embed_type="Q8_0", **SHAPE)
    d = write_tiny_gguf(tmp_path / "d.gguf", seed=8, matrix_type="Q4_0", embed_type="Q8_0", **dict(SHAPE, n_layers=1))
    target = convert(g, tmp_path / "t", dtype="gguf", attention=attention, progress=False)
    draft = convert(d, tmp_path / "d", dtype="gguf", attention=attention, progress=False)
    kw = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
    want = specrt.Decoder(target, max_seq_len=64).generate([1, 2, 3], **kw).token_ids
    got = specrt.Decoder(target, draft, max_seq_len=64).generate([1, 2, 3], **kw).token_ids
    assert got == want and len(want) == 16


@needs_gguf_ops
@pytest.mark.model
def test_smollm2_gguf_generates_and_stays_close_to_fp32(smollm2_gguf_folder: tuple[Path, Path]) -> None:
    """Greedy generation runs on the GGUF's own blocks, and teacher-forced logits stay close to the fp32 form's
    (the same dequantized weights in float32: the only difference is the kernel's int8 activations)."""
    import specrt
    from test_convert_quant_real import logit_gap

    _, folder = smollm2_gguf_folder
    out = specrt.Decoder(folder, max_seq_len=256).generate("The capital of France is", max_new_tokens=12, temperature=0)
    assert len(out.token_ids) > 0
    gap = logit_gap("smollm2-135m-instruct", "gguf")
    # int4 (requantized) gets top-1 ~0.7 / KL ~0.45 here; int8 activations alone should be near int8's 0.99 / 0.005.
    assert gap["top1"] >= 0.9 and gap["kl"] <= 0.05, gap
