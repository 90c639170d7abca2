"""The graph form of the decoder (``specrt convert --attention gqa-graph``; ARCHITECTURE.md "Graph form"): the same
decoder with ``seqlens_k`` / ``total_sequence_length`` / ``logits_index`` as input tensors and an ``argmax`` output,
so that every per-call value can sit at a fixed device address (CUDA graph capture). On the CPU it must give the
logits the default form gives, in prefill, in multi-token steps on a cache, after a rollback and in 1-token steps,
whether ``total_sequence_length`` is the true length (what the CPU runtime feeds) or the cache capacity (what a
captured graph replays with)."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest

from specrt.convert import convert
from specrt.convert.tiny import write_tiny_gguf

L = 64  # KV capacity


@pytest.fixture(scope="module", params=["fp32", "int4"])
def forms(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp(f"graph-form-{request.param}")
    gguf = write_tiny_gguf(root / "t.gguf", arch="qwen2", seed=7, n_layers=2)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    out = {}
    for attention in ("gqa", "gqa-graph"):
        folder = convert(gguf, root / attention, dtype=request.param, progress=False, attention=attention)
        out[attention] = ort.InferenceSession(str(folder / "model.onnx"), so, providers=["CPUExecutionProvider"])
        out["config"] = json.loads((folder / "specrt_config.json").read_text())
    return out


class Decoder:
    """One sequence on a shared past/present buffer of capacity L (emulated by copying each present back)."""

    def __init__(self, sess: ort.InferenceSession, cfg: dict, *, graph: bool, total_is_capacity: bool = False) -> None:
        self.sess, self.graph, self.total_is_capacity = sess, graph, total_is_capacity
        shape = (1, cfg["num_kv_heads"], L, cfg["head_dim"])
        self.kv = {
            f"past_key_values.{i}.{k}": np.zeros(shape, np.float32)
            for i in range(cfg["num_layers"])
            for k in ("key", "value")
        }

    def run(self, ids: list[int], n_past: int, n_logits: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Logits ``[n_logits, vocab]`` of the last ``n_logits`` positions (and the graph form's argmax ``[n]``)."""
        s = len(ids)
        feeds: dict[str, np.ndarray] = {"input_ids": np.array([ids], np.int64), **self.kv}
        if self.graph:
            total = L if self.total_is_capacity else n_past + s
            feeds["seqlens_k"] = np.array([n_past + s - 1], np.int32)
            feeds["total_sequence_length"] = np.array(total, np.int32)
            feeds["logits_index"] = np.arange(s - n_logits, s, dtype=np.int64)
        else:
            feeds["attention_mask"] = np.ones((1, n_past + s), np.int64)
            feeds["num_logits_to_keep"] = np.array(n_logits, np.int64)
        names = [o.name for o in self.sess.get_outputs()]
        outs = dict(zip(names, self.sess.run(None, feeds), strict=True))
        for name, value in outs.items():
            if name.startswith("present."):
                self.kv[name.replace("present.", "past_key_values.")] = value
        argmax = outs["argmax"][0] if "argmax" in outs else None
        return outs["logits"][0], argmax


# (tokens, n_past, n_logits): prefill, a 4-token step on the cache, a rollback to 9 and a 3-token step there,
# then 1-token steps.
STEPS = [
    ([5, 9, 2, 7, 1, 3, 8, 4, 6, 10], 0, 1),
    ([11, 12, 13, 14], 10, 4),
    ([15, 16, 17], 9, 2),
    ([18], 12, 1),
    ([19], 13, 1),
    ([20], 14, 1),
]


@pytest.mark.parametrize("total_is_capacity", [False, True], ids=["total=length", "total=capacity"])
def test_graph_form_gives_the_default_forms_logits(forms: dict, total_is_capacity: bool) -> None:
    ref = Decoder(forms["gqa"], forms["config"], graph=False)
    dut = Decoder(forms["gqa-graph"], forms["config"], graph=True, total_is_capacity=total_is_capacity)
    for ids, n_past, n_logits in STEPS:
        want, _ = ref.run(ids, n_past, n_logits)
        got, argmax = dut.run(ids, n_past, n_logits)
        assert got.shape == want.shape == (n_logits, forms["config"]["vocab_size"])
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5, err_msg=f"step {ids} at {n_past}")
        # The device argmax is the first maximum of each returned row, as specrt's greedy sampler picks.
        assert argmax is not None
        assert argmax.tolist() == [int(np.argmax(row)) for row in got]


def test_graph_form_interface(forms: dict) -> None:
    sess = forms["gqa-graph"]
    inputs = {i.name: i for i in sess.get_inputs()}
    assert "attention_mask" not in inputs and "num_logits_to_keep" not in inputs
    assert inputs["seqlens_k"].type == "tensor(int32)" and inputs["seqlens_k"].shape == [1]
    assert inputs["total_sequence_length"].type == "tensor(int32)" and inputs["total_sequence_length"].shape == []
    assert inputs["logits_index"].type == "tensor(int64)"
    outputs = {o.name: o for o in sess.get_outputs()}
    assert outputs["argmax"].type == "tensor(int64)"
    assert forms["config"]["attention"] == "gqa-graph" and forms["config"]["kv_layout"] == "shared_buffer"
    # No initializer can be overridden per call: every per-call value is a graph input.
    assert not sess.get_overridable_initializers()


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny target (2 layers) and draft (1 layer) in the default form and in the graph form."""
    import specrt

    root = tmp_path_factory.mktemp("graph-form-pair")
    out = {}
    for form in ("gqa", "gqa-graph"):
        paths = {}
        for name, layers in [("target", 2), ("draft", 1)]:
            gguf = write_tiny_gguf(root / f"{name}.gguf", arch="qwen2", seed=3, n_layers=layers)
            paths[name] = convert(gguf, root / f"{form}-{name}", progress=False, attention=form)
        out[form] = specrt.Decoder(paths["target"], paths["draft"], max_seq_len=128)
    return out


@pytest.mark.parametrize("k", [0, 1, 4, "auto"])
def test_greedy_decoding_from_argmax_ids_equals_the_default_form(pairs: dict, k: int | str) -> None:
    """Greedy speculative decoding that reads only argmax ids (``logprobs=False``, the graph form's ``argmax``
    output) gives the default form's tokens; with log-probabilities the graph form gives them too, and the same
    log-probabilities."""
    prompt = [3, 14, 15, 92, 6, 5, 35]
    kw = {"max_new_tokens": 40, "temperature": 0, "num_speculative_tokens": k, "ignore_eos": True}
    want = pairs["gqa"].generate(prompt, **kw)
    ids_only = pairs["gqa-graph"].generate(prompt, **kw, logprobs=False)
    assert ids_only.token_ids == want.token_ids
    assert ids_only.logprobs == []
    if k != "auto":  # auto K's block lengths follow timings: the tokens are the same, their sources may not be
        assert ids_only.sources == want.sources
    with_logprobs = pairs["gqa-graph"].generate(prompt, **kw)
    assert with_logprobs.token_ids == want.token_ids
    np.testing.assert_allclose(with_logprobs.logprobs, want.logprobs, rtol=0, atol=1e-4)
    # The default form reads only ids too (argmax of the logits rows in Rust): same tokens.
    assert pairs["gqa"].generate(prompt, **kw, logprobs=False).token_ids == want.token_ids


def test_logprobs_off_applies_to_sampled_requests_too(pairs: dict) -> None:
    kw = {"max_new_tokens": 24, "temperature": 1.0, "seed": 11, "num_speculative_tokens": 3, "ignore_eos": True}
    a = pairs["gqa"].generate([1, 2, 3], **kw)
    b = pairs["gqa"].generate([1, 2, 3], **kw, logprobs=False)
    # Same seed, same tokens: log-probabilities are computed after the choices and draw nothing.
    assert b.token_ids == a.token_ids and b.logprobs == [] and len(a.logprobs) == len(a.token_ids)


def test_cuda_graph_needs_the_cuda_provider_and_single_stream(capsys: pytest.CaptureFixture[str]) -> None:
    import specrt
    from specrt import cli
    from specrt.errors import ConfigError

    with pytest.raises(ConfigError, match="cuda_graph needs provider 'cuda' \\(got provider 'cpu'\\)"):
        specrt.Decoder("does-not-matter", cuda_graph=True)
    with pytest.raises(ConfigError, match="provider 'tpu' is invalid \\(expected one of: 'cpu', 'cuda'\\)"):
        specrt.Decoder("does-not-matter", provider="tpu", cuda_graph=True)
    with pytest.raises(ConfigError, match="single-stream decoding \\(max_batch 1\\), got max_batch 4"):
        specrt.Decoder("does-not-matter", provider="cuda", cuda_graph=True, max_batch=4)
    # The CLI names its own flags.
    assert cli.main(["generate", "--target", "does-not-matter", "--prompt", "x", "--cuda-graph"]) != 0
    assert "--cuda-graph needs --provider cuda (got --provider cpu)" in capsys.readouterr().err


def test_nan_logits_are_still_detected_on_the_cpu_in_argmax_only_rounds(tmp_path) -> None:
    """On the CPU a graph-form model's argmax-only rounds take the ids from the logits, checked for NaN as always
    (the device argmax, which skips the check, is used on CUDA only)."""
    import onnx
    from onnx import numpy_helper

    import specrt
    from specrt.errors import NonFiniteLogitsError

    gguf = write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2", seed=3, n_layers=1)
    folder = convert(gguf, tmp_path / "m", progress=False, attention="gqa-graph")
    model = onnx.load(str(folder / "model.onnx"), load_external_data=True)
    for init in model.graph.initializer:
        if init.name == "output_norm.weight":
            init.CopyFrom(
                numpy_helper.from_array(np.full(numpy_helper.to_array(init).shape, np.nan, np.float32), init.name)
            )
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    dec = specrt.Decoder(folder, folder, max_seq_len=64)
    for k in (0, 3):
        with pytest.raises(NonFiniteLogitsError):
            dec.generate([1, 2, 3], max_new_tokens=5, temperature=0, num_speculative_tokens=k, logprobs=False)


def test_flags_must_be_bools_named_in_the_error(pairs: dict) -> None:
    import specrt
    from specrt.errors import ConfigError

    dec = pairs["gqa"]
    for name, value in [("logprobs", "false"), ("coupled", 1), ("ignore_eos", None)]:
        with pytest.raises(ConfigError, match=f"{name} {value!r} is invalid \\(expected True or False\\)"):
            dec.generate([1, 2, 3], max_new_tokens=2, **{name: value})
    for name in ("cuda_graph", "allow_fallback"):
        with pytest.raises(ConfigError, match=f"{name} 1 is invalid \\(expected True or False\\)"):
            specrt.Decoder("does-not-matter", **{name: 1})
