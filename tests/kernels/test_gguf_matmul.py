"""specrt's GGUF-block matmul (`specrt._specrt.gguf_matmul`, the kernel of the ``ai.specrt::GgufMatMul`` operator)
against an independent implementation: gguf-py's ``dequantize`` and a numpy matmul, on random blocks of every
supported type and odd shapes; its rows independent of the pass's other rows; its SIMD paths equal to the portable
path bit for bit; and the operator itself through specrt's ONNX Runtime session beside the same numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize  # noqa: E402

from specrt import _specrt  # noqa: E402

TYPES = dict(_specrt.GGUF_MATMUL_TYPES)  # {"Q4_0": 2, ...}
# Where each type keeps its float16 scales (byte offsets within a block), so random blocks get finite ones.
SCALE_OFFSETS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q8_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}
MS = (1, 2, 3, 5, 17, 300)


def random_blocks(name: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``[n, row_bytes]`` uint8: random codes and scales of random sign and size (a few zero)."""
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
    data = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    for off in SCALE_OFFSETS[name]:
        scale = ((rng.random((n, k // block)) - 0.5) * 0.2).astype(np.float16)
        scale[rng.random(scale.shape) < 0.02] = 0
        data[:, :, off : off + 2] = scale.view(np.uint8).reshape(n, k // block, 2)
    return data.reshape(n, -1)


def weights(name: str, blocks: np.ndarray, k: int) -> np.ndarray:
    """gguf-py's dequantization: ``[n, k]`` float64."""
    return dequantize(blocks, gguf.GGMLQuantizationType[name]).reshape(blocks.shape[0], k).astype(np.float64)


def act_block(name: str) -> int:
    """Activations' block length for weights of type ``name``: 256 for the K-quants, else 32."""
    return 256 if name.endswith("_K") else 32


def shapes(name: str) -> list[tuple[int, int]]:
    """K with an odd count of 32-blocks (or of super-blocks), M across decode, verification and prefill."""
    ks = (32, 96, 224, 1536) if gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]][0] == 32 else (256, 768)
    return [(m, k) for k in ks for m in MS]


@pytest.mark.parametrize("name", sorted(TYPES))
def test_grid_activations_match_gguf_py_dequantize_to_float_rounding(name: str) -> None:
    # Activations on the int8 grid (codes times a power of two, each block reaching +-127) quantize without loss, so
    # the kernel must equal dequantize(W) @ x up to float32 summation: K * 2^-24 of sum |w x| per term, bounded here
    # by 1e-5 (K <= 1536).
    rng = np.random.default_rng(1)
    for m, k in shapes(name):
        blocks = random_blocks(name, 9, k, rng)
        codes = rng.integers(-127, 128, size=(m, k // 32, 32))
        codes[:, :, 0] = 127
        x = (codes * 2.0**-4).reshape(m, k).astype(np.float32)
        w = weights(name, blocks, k)
        want = x.astype(np.float64) @ w.T
        mag = np.abs(x.astype(np.float64)) @ np.abs(w).T
        got = _specrt.gguf_matmul(x, blocks, TYPES[name])
        assert got.shape == (m, 9) and got.dtype == np.float32
        err = np.abs(got - want)
        assert (err <= 1e-5 * mag + 1e-6).all(), f"{name} M={m} K={k}: worst {err.max()} (sum|wx| {mag.max()})"


@pytest.mark.parametrize("name", sorted(TYPES))
def test_any_activations_stay_within_the_int8_rounding_bound(name: str) -> None:
    # Each activation moves by at most half a code, d / 2 with d = max|x_block| / 127 over its block (32 values for
    # the 32-long formats, 256 for the K-quants, as llama.cpp quantizes activations), so
    # |y - dequantize(W) @ x| <= sum_e |w_e| d(e) / 2 (+ float32 rounding).
    rng = np.random.default_rng(2)
    for m, k in shapes(name):
        blocks = random_blocks(name, 7, k, rng)
        x = (rng.standard_normal((m, k)) * np.where(rng.random((m, k)) < 0.01, 20.0, 1.0)).astype(np.float32)
        w = weights(name, blocks, k)
        ab = act_block(name)
        d = np.abs(x.reshape(m, k // ab, ab)).max(axis=2).astype(np.float64) / 127  # [m, k / ab]
        half_code = np.repeat(d, ab, axis=1) / 2  # [m, k]
        bound = half_code @ np.abs(w).T * 1.0001 + 1e-5 * (np.abs(x.astype(np.float64)) @ np.abs(w).T) + 1e-6
        got = _specrt.gguf_matmul(x, blocks, TYPES[name], threads=2)
        err = np.abs(got - x.astype(np.float64) @ w.T)
        assert (err <= bound).all(), f"{name} M={m} K={k}: {np.argwhere(err > bound)[:3]}"


def test_the_grid_check_catches_a_wrong_scale_and_a_dropped_tail() -> None:
    # The grid check must fail for a kernel with a bug: emulate one by feeding the kernel blocks whose last block is
    # zeroed (a dropped tail) or whose scales are rotated by one block (a wrong scale index), against the true W.
    rng = np.random.default_rng(3)
    for name in sorted(TYPES):
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
        k = 3 * block
        blocks = random_blocks(name, 5, k, rng)
        codes = rng.integers(-127, 128, size=(2, k // 32, 32))
        codes[:, :, 0] = 127
        x = (codes * 2.0**-4).reshape(2, k).astype(np.float32)
        w = weights(name, blocks, k)
        tol = 1e-5 * (np.abs(x.astype(np.float64)) @ np.abs(w).T) + 1e-6
        assert (np.abs(_specrt.gguf_matmul(x, blocks, TYPES[name]) - x @ w.T) <= tol).all()
        dropped = blocks.reshape(5, 3, size).copy()
        dropped[:, 2, :] = 0
        rotated = blocks.reshape(5, 3, size).copy()
        for off in SCALE_OFFSETS[name]:
            rotated[:, :, off : off + 2] = np.roll(rotated[:, :, off : off + 2], 1, axis=1)
        for broken in (dropped, rotated):
            y = _specrt.gguf_matmul(x, np.ascontiguousarray(broken.reshape(5, -1)), TYPES[name])
            assert not (np.abs(y - x @ w.T) <= tol).all(), name


@pytest.mark.parametrize("name", sorted(TYPES))
def test_a_row_is_the_same_bits_alone_and_in_any_pass(name: str) -> None:
    rng = np.random.default_rng(4)
    k = 512 if name.endswith("_K") else 224
    blocks = random_blocks(name, 33, k, rng)
    x = rng.standard_normal((17, k)).astype(np.float32)
    whole = _specrt.gguf_matmul(x, blocks, TYPES[name], threads=2)
    for rows in ([0], [4], [2, 3, 4, 5, 6], [16]):
        part = _specrt.gguf_matmul(np.ascontiguousarray(x[rows]), blocks, TYPES[name])
        assert part.tobytes() == whole[rows].tobytes(), f"{name} rows {rows}"


@pytest.mark.parametrize("name", sorted(TYPES))
def test_every_simd_path_equals_the_portable_path_bit_for_bit(name: str) -> None:
    rng = np.random.default_rng(5)
    k = 768 if name.endswith("_K") else 1536
    blocks = random_blocks(name, 40, k, rng)
    x = rng.standard_normal((5, k)).astype(np.float32)
    want = _specrt.gguf_matmul(x, blocks, TYPES[name], path="portable")
    for path in _specrt.gguf_kernel_paths():
        assert _specrt.gguf_matmul(x, blocks, TYPES[name], path=path).tobytes() == want.tobytes(), path


@pytest.mark.parametrize("name", sorted(TYPES))
def test_dequantize_equals_gguf_py(name: str) -> None:
    rng = np.random.default_rng(6)
    k = 512 if name.endswith("_K") else 96
    blocks = random_blocks(name, 6, k, rng)
    got = _specrt.gguf_dequantize(blocks, TYPES[name], k)
    want = weights(name, blocks, k)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7 * np.abs(want).max())


def test_bad_arguments_name_the_field() -> None:
    from specrt.errors import ConfigError, ShapeError

    x = np.zeros((1, 64), np.float32)
    blocks = np.zeros((2, 36), np.uint8)
    with pytest.raises(ConfigError) as e:
        _specrt.gguf_matmul(x, blocks, 1)
    assert e.value.field == "ggml_type"
    with pytest.raises(ConfigError) as e:
        _specrt.gguf_matmul(x, blocks, TYPES["Q4_0"], path="sse9")
    assert e.value.field == "path"
    with pytest.raises(ShapeError):
        _specrt.gguf_matmul(x, np.zeros((2, 35), np.uint8), TYPES["Q4_0"])
    with pytest.raises(ConfigError):
        _specrt.gguf_matmul(np.zeros((1, 96), np.float32), np.zeros((2, 54), np.uint8), TYPES["Q4_K"])


def one_node_model(tmp_path, node, inits, inputs, output_dims):
    """Save a one-node model (opsets: default 18, ``ai.specrt`` 1) and return its path."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, output_dims)], initializer=inits
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(_specrt.OPERATOR_DOMAIN, 1)]
    )
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q4_1", "Q8_0"])
def test_the_operator_in_an_onnx_runtime_session_equals_the_kernel_for_every_pass_length(tmp_path, name) -> None:
    from onnx import TensorProto, helper, numpy_helper

    from specrt._ort import find_ort_library

    rng = np.random.default_rng(7)
    k, n = 512, 40
    blocks = random_blocks(name, n, k, rng)
    node = helper.make_node(
        "GgufMatMul", ["A", "B"], ["Y"], domain=_specrt.OPERATOR_DOMAIN, ggml_type=TYPES[name], K=k, N=n
    )
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "M", k])
    path = one_node_model(tmp_path, node, [numpy_helper.from_array(blocks, "B")], [a], [1, "M", n])
    session = _specrt.GraphSession(str(path), str(find_ort_library()), intra_op_threads=2)
    x = rng.standard_normal((1, 17, k)).astype(np.float32)
    whole = session.run({"A": x})["Y"]
    assert whole.shape == (1, 17, n)
    assert whole[0].tobytes() == _specrt.gguf_matmul(x[0], blocks, TYPES[name]).tobytes()
    for m in (1, 5):
        assert session.run({"A": np.ascontiguousarray(x[:, :m])})["Y"].tobytes() == whole[:, :m].tobytes()


def test_the_gather_operator_returns_gguf_py_rows(tmp_path) -> None:
    from onnx import helper, numpy_helper

    from specrt._ort import find_ort_library

    rng = np.random.default_rng(8)
    k, vocab = 256, 50
    blocks = random_blocks("Q6_K", vocab, k, rng)
    ids = np.array([[3, 0, 49, 3]], np.int64)
    node = helper.make_node(
        "GgufGather", ["B", "ids"], ["Y"], domain=_specrt.OPERATOR_DOMAIN, ggml_type=TYPES["Q6_K"], K=k
    )
    inits = [numpy_helper.from_array(blocks, "B"), numpy_helper.from_array(ids, "ids")]
    path = one_node_model(tmp_path, node, inits, [], [1, 4, k])
    got = _specrt.GraphSession(str(path), str(find_ort_library())).run({})["Y"]
    want = weights("Q6_K", blocks, k)[ids]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7 * np.abs(want).max())
