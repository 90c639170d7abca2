"""``specrt bench --provider cuda`` and ``--random-shapes`` (``specrt.bench.random_models``): the CPU path of the code
the GPU bench runs, on test-sized random-weight models; the refusal of CUDA on the CPU build of ONNX Runtime before any
work; the real Qwen2.5-Coder shapes of the random-weight writer (checked without writing the big models).

The test marked ``gpu`` runs the same bench on CUDA (``pytest -m gpu tests/gpu/test_bench_cuda.py`` on a GPU machine).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import specrt.bench.random_models as rm
from specrt import _specrt, bench
from specrt._ort import cuda_provider_library, find_ort_library
from specrt.errors import ProviderError
from specrt.models import cache_dir

REPO = Path(__file__).resolve().parents[2]

#: specrt's cache as the environment names it, before the ``cache`` fixture points it at a temporary folder.
USER_CACHE = cache_dir()

#: The t(n) measured in the tiny runs: n = 1..5 gives K = 1..4 besides the Ks of the run.
TINY_NS = (1, 2, 3, 4, 5)


def _cuda_build_installed() -> bool:
    try:
        return cuda_provider_library(find_ort_library()) is not None
    except FileNotFoundError:
        return False


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    return p


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    """``$SPECRT_CACHE_DIR`` in a temporary folder for the whole module (random models are written there)."""
    root = tmp_path_factory.mktemp("specrt-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECRT_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.json"
    prompts = {
        "sets": {"main": ["raw", "chat"], "sweep": ["raw"]},
        "prompts": [
            {"id": "raw", "kind": "code_completion", "prompt": "def add(a, b):", "peer": "a"},
            {"id": "chat", "kind": "chat_answer", "messages": [{"role": "user", "content": "hello there"}]},
        ],
    }
    path.write_text(json.dumps(prompts), encoding="utf-8")
    return path


def _tiny_config(prompts_file: Path, out: Path, **overrides) -> bench.BenchConfig:
    base = bench.BenchConfig(
        random_shapes="tiny",
        prompts_file=str(prompts_file),
        max_new_tokens=12,
        sweep_max_new_tokens=8,
        k=3,
        k_sweep=(0, 3),
        temperatures=(0.0,),
        repeats=2,
        verify_repeats=1,
        verify_ns=TINY_NS,
        warmup_tokens=2,
        threads=1,
        out_dir=str(out),
        name="random-tiny",
        progress=False,
    )
    return replace(base, **overrides)


@pytest.fixture(scope="module")
def report(cache, prompts_file, tmp_path_factory) -> dict:
    cfg = _tiny_config(prompts_file, tmp_path_factory.mktemp("out"))
    rep = bench.run_bench(cfg)
    rep["_paths"] = {k: str(v) for k, v in bench.save(rep, cfg).items()}
    return rep


# ----- the random-weight writer ------------------------------------------------------------------------------------


def test_random_shapes_are_the_qwen2_5_coder_config_values() -> None:
    common = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "use_sliding_window": False,
        "torch_dtype": "float16",
    }
    t = rm.hf_config(rm.SHAPES["qwen2.5-coder-1.5b"])
    d = rm.hf_config(rm.SHAPES["qwen2.5-coder-0.5b"])
    assert t == common | {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
    }
    assert d == common | {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    }
    # The model cards' parameter counts (1.54B and 0.49B; non-embedding 1.31B and 0.36B), tensor by tensor.
    assert rm.n_parameters(rm.SHAPES["qwen2.5-coder-1.5b"]) == 1_543_714_304
    assert rm.n_parameters(rm.SHAPES["qwen2.5-coder-0.5b"]) == 494_032_768
    shapes = rm.tensor_shapes(rm.SHAPES["qwen2.5-coder-1.5b"])
    assert shapes["model.embed_tokens.weight"] == (151936, 1536) and "lm_head.weight" not in shapes
    assert shapes["model.layers.27.self_attn.k_proj.weight"] == (256, 1536)  # 2 kv heads x head_dim 128
    assert shapes["model.layers.27.mlp.down_proj.weight"] == (1536, 8960)
    pair = rm.SHAPE_PAIRS["qwen2.5-coder"]
    assert (pair.target, pair.draft, pair.truncated_layers) == ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", 4)


def test_the_7b_shape_is_the_qwen2_5_coder_7b_config_and_pairs_with_both_small_drafts() -> None:
    # Qwen/Qwen2.5-Coder-7B-Instruct's config.json: its own lm_head, 152064 logits (the small models' 151936, one
    # tokenizer).
    assert rm.hf_config(rm.SHAPES["qwen2.5-coder-7b"]) == {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "use_sliding_window": False,
        "torch_dtype": "float16",
    }
    # The model card's 7.61B (6.53B non-embedding).
    assert rm.n_parameters(rm.SHAPES["qwen2.5-coder-7b"]) == 7_615_616_512
    shapes = rm.tensor_shapes(rm.SHAPES["qwen2.5-coder-7b"])
    assert shapes["lm_head.weight"] == shapes["model.embed_tokens.weight"] == (152064, 3584)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (512, 3584)  # 4 kv heads x head_dim 128
    for name, draft in (("qwen2.5-coder-7b", "qwen2.5-coder-0.5b"), ("qwen2.5-coder-7b-1.5b", "qwen2.5-coder-1.5b")):
        pair = rm.SHAPE_PAIRS[name]
        assert (pair.target, pair.draft, pair.truncated_layers) == ("qwen2.5-coder-7b", draft, 2)
        assert rm.SHAPES[pair.draft].vocab_size == 151936


def test_tiled_weights_have_the_std_no_repeated_rows_and_a_disk_bound_writer() -> None:
    shapes = {"a": (1000, 96), "b": (7, 5)}
    n = rm.block_values(shapes)
    assert n == 96001  # the smallest prime >= 96000
    assert rm.block_values({"x": (1 << 13, 1 << 12)}) == rm.BLOCK_VALUES
    tiles = rm._TiledValues(np.random.default_rng(0), n, 1 << 14)
    a = np.concatenate(list(tiles.chunks(1000 * 96, 0.02))).reshape(1000, 96)
    assert a.dtype == np.float16 and float(a.astype(np.float32).std()) == pytest.approx(0.02, rel=0.02)
    assert len({r.tobytes() for r in a}) == 1000  # no row repeats
    # Chunks are views of the extended block: nothing computed per chunk.
    assert all(c.base is not None for c in tiles.chunks(40_000, 0.02))


@pytest.mark.parametrize(("shape", "registry"), [("1.5b", "1.5b-instruct"), ("0.5b", "0.5b-instruct")])
def test_random_shapes_match_the_converted_real_models_when_cached(shape: str, registry: str) -> None:
    folders = sorted((USER_CACHE / "models" / f"qwen2.5-coder-{registry}").glob("*/specrt_config.json"))
    if not folders:
        pytest.skip(f"qwen2.5-coder-{registry} not converted in the cache")
    real = json.loads(folders[0].read_text(encoding="utf-8"))
    s = rm.SHAPES[f"qwen2.5-coder-{shape}"]
    assert (real["hidden_size"], real["intermediate_size"], real["num_layers"]) == (
        s.hidden_size,
        s.intermediate_size,
        s.num_hidden_layers,
    )
    assert (real["num_attention_heads"], real["num_kv_heads"], real["head_dim"]) == (
        s.num_attention_heads,
        s.num_key_value_heads,
        s.head_dim,
    )
    assert (real["vocab_size"], real["max_position_embeddings"], real["rope_theta"]) == (
        s.vocab_size,
        s.max_position_embeddings,
        s.rope_theta,
    )
    assert real["rms_norm_eps"] == pytest.approx(s.rms_norm_eps)


def test_random_hf_folder_has_the_shape_is_deterministic_and_converts(tmp_path: Path) -> None:
    from specrt.convert import convert

    tok = rm.write_stand_in_tokenizer(tmp_path / "tok")
    shape = rm.SHAPES["tiny-draft"]
    a = rm.write_random_hf(shape, tmp_path / "a", tokenizer_dir=tok, seed=3, layer_scale=0.5)
    b = rm.write_random_hf(shape, tmp_path / "b", tokenizer_dir=tok, seed=3, layer_scale=0.5)
    assert json.loads((a / "config.json").read_text()) == rm.hf_config(shape)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    from safetensors.numpy import load_file

    tensors = load_file(str(a / "model.safetensors"))
    assert {k: v.shape for k, v in tensors.items()} == rm.tensor_shapes(shape)
    embed, q = tensors["model.embed_tokens.weight"], tensors["model.layers.0.self_attn.q_proj.weight"]
    # std 0.02 for the embedding, 0.02 * layer_scale in the layers (float16; 512 x 32 values: +-5%).
    assert float(embed.astype("float32").std()) == pytest.approx(rm.WEIGHT_STD, rel=0.05)
    assert float(q.astype("float32").std()) == pytest.approx(rm.WEIGHT_STD * 0.5, rel=0.1)
    assert (tensors["model.norm.weight"] == 1).all()
    out = convert(a, tmp_path / "onnx", dtype="fp32", progress=False)
    cfg = json.loads((out / "specrt_config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_layers"], cfg["num_kv_heads"], cfg["vocab_size"]) == (32, 1, 1, 512)
    assert cfg["tied_embeddings"] is False and cfg["rope_theta"] == 1e6


def test_random_models_are_cached_and_rebuilt_when_the_recipe_changes(cache, tmp_path: Path) -> None:
    first = rm.ensure_random_models("tiny", "fp32", root=tmp_path / "tiny")
    stamp = (first.target / "model.onnx").stat().st_mtime_ns
    assert first.complete() and first.truncated_draft.name == "target-L1"
    assert not (tmp_path / "tiny" / "hf-target").exists()  # the Hugging Face folders are removed
    again = rm.ensure_random_models("tiny", "fp32", root=tmp_path / "tiny")
    assert (again.target / "model.onnx").stat().st_mtime_ns == stamp
    rebuilt = rm.ensure_random_models("tiny", "fp32", root=tmp_path / "tiny", seed=5)
    assert rebuilt.recipe["seed"] == 5 and (rebuilt.target / "model.onnx").stat().st_mtime_ns != stamp
    trunc = json.loads((rebuilt.truncated_draft / "specrt_config.json").read_text())
    assert trunc["num_layers"] == 1 and trunc["truncated_from"] == 2
    assert rm.random_dir() == cache / "random"
    with pytest.raises(
        ValueError,
        match=r"random shapes 'huge' are unknown \(expected one of: qwen2.5-coder, qwen2.5-coder-7b, "
        r"qwen2.5-coder-7b-1.5b, tiny\)",
    ):
        rm.ensure_random_models("huge", "fp32")
    with pytest.raises(FileNotFoundError, match=r"has no tokenizer\.json"):
        rm.ensure_random_models("tiny", "fp32", tokenizer=tmp_path)
    # The graph form (for --cuda-graph) is cached beside the default form, under its own name.
    graph = rm.ensure_random_models("tiny", "fp32", attention="gqa-graph")
    assert graph.root.name == "tiny-fp32-G" and graph.recipe["attention"] == "gqa-graph"
    assert json.loads((graph.draft / "specrt_config.json").read_text())["attention"] == "gqa-graph"


# ----- the bench on random weights (CPU) ---------------------------------------------------------------------------


def test_random_weight_report_predicts_the_real_pair_from_the_measured_costs(report) -> None:
    rw = report["random_weights"]
    assert report["config"]["provider"] == "cpu" and report["config"]["dtype"] == "fp32"
    assert rw["acceptance"] == bench.QWEN_CODER_ACCEPTANCE
    assert "default-fp32-with-peers-2026-11-29.json" in rw["acceptance_source"]
    assert rw["target_shape"]["name"] == "tiny-target" and rw["tokenizer"]["stand_in"] is True
    pred = rw["prediction"]
    assert pred["k"] == 3 and [x["k"] for x in pred["mean_per_k"]] == [1, 2, 3, 4]
    a = rw["acceptance"]
    for row, p in zip(report["main"]["prompts"], pred["prompts"], strict=True):
        assert p["id"] == row["id"]
        c_q, c_p = row["c_q_ms"]["median"], row["c_p_ms"]["median"]
        ratios = report["verify_costs"][row["id"]]["c_verify_ratio"]
        for x in p["per_k"]:
            k = x["k"]
            assert x["c_verify_ratio"] == ratios[str(k)]
            assert x["expected_tokens"] == pytest.approx((1 - a ** (k + 1)) / (1 - a))
            # c_p E / (K c_q + c_verify(K)) with c_verify(K) = t(K + 1) / t(1) * c_p.
            assert x["predicted_speedup"] == pytest.approx(
                c_p * x["expected_tokens"] / (k * c_q + ratios[str(k)] * c_p)
            )
            assert x["predicted_tokens_per_s"] == pytest.approx(
                row["target_only"]["decode_tokens_per_s"]["median"] * x["predicted_speedup"]
            )
        assert p["best_k"] == max(p["per_k"], key=lambda x: x["predicted_speedup"])["k"]
    at3 = [x for p in pred["prompts"] for x in p["per_k"] if x["k"] == 3]
    assert pred["predicted_speedup"] == pytest.approx(statistics.fmean(x["predicted_speedup"] for x in at3))


def test_t_of_n_is_measured_for_every_asked_n(report) -> None:
    assert report["config"]["verify_ns"] == list(TINY_NS)
    for c in report["verify_costs"].values():
        assert {int(n) for n in c["forward_ms"]} == set(TINY_NS)
        assert set(c["c_verify_ratio"]) == {str(n - 1) for n in TINY_NS}


def test_synthetic_pairs_have_the_acceptance_they_are_built_for(report) -> None:
    full = report["random_weights"]["full_acceptance"]
    assert full["models"]["draft"].endswith("target-L1")
    assert full["models"]["target"] == report["models"]["target"]
    for p in full["main"]["prompts"]:
        # The target's layers barely move its residual stream: its first layer alone predicts the same tokens.
        assert p["acceptance_rate"]["median"] == 1.0 and p["greedy_parity"] is True
        assert p["predicted_speedup"] is not None and p["measured_over_predicted"] is not None
        assert p["speculative"]["n_emitted"]["median"] == 12  # EOS is ignored with random weights
    for p in report["main"]["prompts"]:
        assert p["acceptance_rate"]["median"] < 0.5 and p["greedy_parity"] is True  # the random draft
        assert p["measured_over_predicted"] is not None
    assert report["sweeps"]["pair"] == "full_acceptance"
    (entry,) = report["sweeps"]["k_sweep"]["prompts"]
    assert [pt["k"] for pt in entry["points"]] == [0, 3]


def test_random_weight_table_prints_the_prediction_and_the_check(report, tmp_path: Path) -> None:
    data = json.loads(Path(report["_paths"]["json"]).read_text(encoding="utf-8"))
    with (tmp_path / "table.txt").open("w") as f:
        text = bench.render_table(data, use_rich=False, file=f)
    for needle in (
        "random weights in the tiny shapes (fp32)",
        "t(n): target forward over n tokens",
        "predicted speedup of the real pair at a = 0.907",
        "cost-model check on synthetic pairs",
        "truncated draft",
        "random draft",
        "best",
        "main K",
        "sweeps (full-acceptance pair)",
    ):
        assert needle in text, needle
    rich = pytest.importorskip("rich")
    assert rich is not None
    with (tmp_path / "rich.txt").open("w") as f:
        bench.render_table(data, use_rich=True, file=f)
    assert "cost-model check" in (tmp_path / "rich.txt").read_text()


def test_default_acceptance_is_the_a_of_the_default_runs_mean_e() -> None:
    data = json.loads((REPO / "benches/results/default-fp32-with-peers-2026-11-29.json").read_text(encoding="utf-8"))
    assert data["config"]["k"] == 4 and data["config"]["temperature"] == 0
    e = data["main"]["totals"]["all"]["mean_tokens_per_round"]
    assert _specrt.alpha_from_tokens_per_round(e, 4) == pytest.approx(bench.QWEN_CODER_ACCEPTANCE, abs=5e-4)


def test_predict_from_acceptance_worked_example() -> None:
    # a = 0.8, K = 2: E = 1 + 0.8 + 0.64 = 2.44; c_q = 1, c_p = 10, c_verify(2) = 1.1 c_p = 11:
    # speedup = 10 * 2.44 / (2 * 1 + 11) = 1.8769; K = 1: E = 1.8, 10 * 1.8 / (1 + 10.5) = 1.5652.
    row = {"id": "p", "c_q_ms": {"median": 1.0}, "c_p_ms": {"median": 10.0}}
    row["target_only"] = {"decode_tokens_per_s": {"median": 100.0}}
    costs = {"p": {"c_verify_ratio": {"0": 1.0, "1": 1.05, "2": 1.1}}}
    out = bench.predict_from_acceptance(0.8, [row], costs, "auto")
    (p,) = out["prompts"]
    assert [x["k"] for x in p["per_k"]] == [1, 2]
    assert p["per_k"][1]["predicted_speedup"] == pytest.approx(24.4 / 13)
    assert p["per_k"][0]["predicted_speedup"] == pytest.approx(18 / 11.5)
    assert p["per_k"][1]["predicted_tokens_per_s"] == pytest.approx(100 * 24.4 / 13)
    assert out["best_k"] == 2 and out["predicted_speedup"] == pytest.approx(24.4 / 13)  # auto: the best K
    # No measured c_q (no draft pass): no prediction, not an error.
    row["c_q_ms"] = None
    assert bench.predict_from_acceptance(0.8, [row], costs, 2)["predicted_speedup"] is None


# ----- settings and the CUDA refusal -------------------------------------------------------------------------------


def test_cuda_defaults_to_fp16_and_t_of_n_for_n_1_to_16() -> None:
    p = _parser()
    cfg = bench.config_from_args(p.parse_args(["--provider", "cuda"]))
    assert cfg.provider == "cuda" and cfg.dtype == "fp16"
    assert bench.config_from_args(p.parse_args([])).dtype == "fp32"
    resolved = bench.resolve_config(bench.BenchConfig(provider="cuda"))
    assert resolved.dtype == "fp16" and resolved.verify_ns == tuple(range(1, 17))
    assert bench.resolve_config(bench.BenchConfig()).verify_ns == ()  # the CPU default stays as it was
    cfg = bench.config_from_args(p.parse_args(["--verify-ns", "1-4,8", "--random-shapes", "tiny"]))
    assert cfg.verify_ns == (1, 2, 3, 4, 8) and cfg.random_shapes == "tiny" and cfg.acceptance is None
    resolved = bench.resolve_config(cfg)
    assert resolved.ignore_eos is True and resolved.acceptance == bench.QWEN_CODER_ACCEPTANCE
    assert bench.config_from_args(p.parse_args(["--acceptance", "0.8"])).acceptance == 0.8
    for bad in (["--verify-ns", "1-x"], ["--random-shapes", "qwen3"], ["--provider", "rocm"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)


def test_invalid_provider_settings_fail_before_anything_runs(capsys) -> None:
    cases = [
        (bench.BenchConfig(provider="cuda", dtype="fp32"), r"dtype 'fp32' is invalid with provider 'cuda'"),
        (bench.BenchConfig(provider="rocm"), r"provider 'rocm' is invalid \(expected one of: 'cpu', 'cuda'\)"),
        (bench.BenchConfig(random_shapes="qwen3"), r"random shapes 'qwen3' are unknown"),
        (bench.BenchConfig(acceptance=1.5), r"acceptance 1.5 is invalid"),
        (bench.BenchConfig(verify_ns=(0, 4)), r"verify ns \[0\] are invalid"),
        (bench.BenchConfig(provider="cuda", peers=("genai",)), r"run on CPU with the real models only"),
        (bench.BenchConfig(cuda_graph=True), r"cuda_graph needs provider 'cuda' \(got provider 'cpu'\)"),
    ]
    for cfg, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            bench.validate_config(cfg)
        with pytest.raises(ValueError, match=pattern):
            bench.run_bench(replace(cfg, target="no-such-model"))
    assert bench.run_cli(_parser().parse_args(["--provider", "cuda", "--dtype", "int4"])) == 2
    err = capsys.readouterr().err
    assert "specrt bench: error: dtype 'int4' is invalid with provider 'cuda'" in err and "Traceback" not in err


@pytest.mark.skipif(_cuda_build_installed(), reason="the CUDA build of ONNX Runtime is installed")
def test_cuda_on_the_cpu_build_fails_before_any_work_naming_the_cuda_extra(
    cache, prompts_file, tmp_path, capsys
) -> None:
    cfg = _tiny_config(prompts_file, tmp_path / "out", provider="cuda", name="cuda")
    random_dir = cache / "random" / "tiny-fp16"
    with pytest.raises(ProviderError, match=r"pip install 'specrt\[cuda\]'"):
        bench.run_bench(cfg)
    with pytest.raises(ProviderError):
        bench.check_provider("cuda")
    bench.check_provider("cpu")
    args = ["--provider", "cuda", "--random-shapes", "tiny", "--prompts-file", str(prompts_file)]
    assert bench.run_cli(_parser().parse_args([*args, "--out-dir", str(tmp_path / "out")])) == 2
    err = capsys.readouterr().err
    assert "specrt bench: error:" in err and "specrt[cuda]" in err and "Traceback" not in err
    assert not random_dir.exists() and not (tmp_path / "out").exists()  # nothing written, nothing loaded


def test_settings_without_effect_are_warned_about(capsys) -> None:
    w = bench.config.config_warnings(bench.BenchConfig(acceptance=0.5, random_tokenizer="/x"))
    assert any("--acceptance has no effect without --random-shapes" in line for line in w)
    assert any("--random-tokenizer has no effect" in line for line in w)
    w = bench.config.config_warnings(bench.BenchConfig(random_shapes="tiny", target="other"))
    assert w == ["--target / --draft are not used with --random-shapes tiny"]


# ----- on a GPU ----------------------------------------------------------------------------------------------------


def _cuda_usable() -> bool:
    try:
        bench.check_provider("cuda")
    except (ProviderError, FileNotFoundError):
        return False
    return True


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_usable(), reason="no usable CUDA provider (pip install 'specrt[cuda]' on a GPU machine)")
def test_random_weight_bench_runs_on_cuda_in_fp16(cache, prompts_file, tmp_path) -> None:
    rep = bench.run_bench(_tiny_config(prompts_file, tmp_path, provider="cuda", verify_ns=(), sweeps=False))
    assert rep["config"]["dtype"] == "fp16" and rep["config"]["verify_ns"] == list(range(1, 17))
    assert rep["random_weights"]["dtype"] == "fp16"
    for c in rep["verify_costs"].values():
        assert {int(n) for n in c["forward_ms"]} == set(range(1, 17))
        assert all(math.isfinite(s["median"]) for s in c["forward_ms"].values())
    for p in rep["random_weights"]["full_acceptance"]["main"]["prompts"]:
        assert p["acceptance_rate"]["median"] == 1.0 and p["greedy_parity"] is True
    assert rep["random_weights"]["prediction"]["predicted_speedup"] is not None
