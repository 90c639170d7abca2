"""``specrt bench`` (``specrt.bench``) on tiny converted models: the JSON fields, the arithmetic of every derived
figure (predicted speedup from the measured E and costs equals the cost functions), prompt sets, CLI parsing.

Timings on tiny models mean nothing; these tests check the code path and the bookkeeping, not speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import specrt
from specrt import _specrt, bench
from specrt.convert import convert
from specrt.convert.tiny import write_tiny_gguf

REPO = Path(__file__).resolve().parents[2]


def _convert_tiny(root: Path, name: str, **kw) -> Path:
    gguf = write_tiny_gguf(root / f"{name}.gguf", **kw)
    return convert(gguf, root / name, progress=False)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 2-layer qwen2 target, a 1-layer draft of the same weights, and a small prompt file (raw + chat)."""
    root = tmp_path_factory.mktemp("bench_tiny")
    prompts = {
        "sets": {"main": ["raw", "chat"], "sweep": ["raw"]},
        "prompts": [
            {"id": "raw", "kind": "code_completion", "prompt": "def add(a, b):", "peer": "a"},
            {"id": "chat", "kind": "chat_answer", "messages": [{"role": "user", "content": "hello there"}]},
        ],
    }
    (root / "prompts.json").write_text(json.dumps(prompts), encoding="utf-8")
    return {
        "target": _convert_tiny(root, "target", arch="qwen2", seed=1, n_layers=2),
        "draft": _convert_tiny(root, "draft", arch="qwen2", seed=1, n_layers=1),
        "prompts": root / "prompts.json",
        "out": root / "out",
    }


@pytest.fixture(scope="module")
def report(tiny_pair) -> dict:
    cfg = bench.BenchConfig(
        target=str(tiny_pair["target"]),
        draft=str(tiny_pair["draft"]),
        prompts_file=str(tiny_pair["prompts"]),
        max_new_tokens=12,
        sweep_max_new_tokens=8,
        k=3,
        k_sweep=(0, 1, 3),
        temperatures=(0.0, 1.0),
        repeats=3,
        verify_repeats=2,
        warmup_tokens=2,
        threads=1,
        max_seq_len=128,
        ignore_eos=True,
        out_dir=str(tiny_pair["out"]),
        name="tiny",
        progress=False,
    )
    rep = bench.run_bench(cfg)
    rep["_paths"] = {k: str(v) for k, v in bench.save(rep, cfg).items()}
    return rep


def test_report_has_every_documented_field(report) -> None:
    assert report["schema"] == bench.SCHEMA
    assert set(report["verify_costs"]) == {"raw", "chat"}
    main = report["main"]
    assert main["k"] == 3 and [p["id"] for p in main["prompts"]] == ["raw", "chat"]
    for p in main["prompts"]:
        for key in (
            "speedup",
            "e2e_speedup",
            "acceptance_rate",
            "mean_tokens_per_round",
            "alpha_fit",
            "c_q_ms",
            "c_p_ms",
            "c_verify_ratio",
            "c_verify_ratio_in_run",
            "predicted_speedup",
            "predicted_speedup_seed",
            "measured_over_predicted",
            "round_ms",
            "greedy_parity",
        ):
            assert p[key] is not None, key
        for mode in ("target_only", "speculative"):
            for key in ("decode_tokens_per_s", "tokens_per_s", "prefill_ms", "n_emitted"):
                s = p[mode][key]
                assert s["n"] == 3 and s["min"] <= s["median"] <= s["max"], (mode, key)
        assert len(p["runs"]["target_only"]) == len(p["runs"]["speculative"]) == 3
        assert p["speedup"]["n"] == 3
    assert set(main["totals"]) == {"all", "peer_prompts"}
    assert main["totals"]["peer_prompts"]["prompts"] == ["raw"]
    assert report["machine"]["load_avg_end"] is not None and report["wall_s"] > 0


def test_greedy_speculative_output_matches_target_only(report) -> None:
    for p in report["main"]["prompts"]:
        assert p["greedy_parity"] is True and p["first_divergence"] is None
        assert p["speculative"]["n_emitted"]["median"] == 12  # ignore_eos


def test_derived_figures_follow_from_the_raw_runs(report) -> None:
    for p in report["main"]["prompts"]:
        base, spec = p["runs"]["target_only"], p["runs"]["speculative"]
        for r in base + spec:
            assert r["decode_ms"] == pytest.approx(r["wall_ms"] - r["prefill_ms"])
            assert r["decode_tokens_per_s"] == pytest.approx(r["n_emitted"] / r["decode_ms"] * 1e3)
            assert r["tokens_per_s"] == pytest.approx(r["n_emitted"] / r["wall_ms"] * 1e3)
        pairs = [s["decode_tokens_per_s"] / b["decode_tokens_per_s"] for b, s in zip(base, spec, strict=True)]
        assert p["speedup"]["median"] == pytest.approx(statistics.median(pairs))
        assert p["acceptance_rate"]["median"] == pytest.approx(
            statistics.median(r["n_accepted"] / r["n_drafted"] for r in spec)
        )
        assert p["mean_tokens_per_round"]["median"] == pytest.approx(
            statistics.median(r["n_emitted"] / r["n_rounds"] for r in spec)
        )
        assert p["c_q_ms"]["median"] == pytest.approx(statistics.median(r["draft_ms"] / r["n_drafted"] for r in spec))
        assert p["c_p_ms"]["median"] == pytest.approx(statistics.median(r["decode_ms"] / r["n_emitted"] for r in base))


def test_predicted_speedup_is_the_cost_model_at_the_measured_terms(report) -> None:
    costs = report["verify_costs"]
    for p in report["main"]["prompts"]:
        k, e = 3, p["mean_tokens_per_round"]["median"]
        c_q, c_p, ratio = p["c_q_ms"]["median"], p["c_p_ms"]["median"], p["c_verify_ratio"]
        assert ratio == costs[p["id"]]["c_verify_ratio"]["3"]
        fwd = costs[p["id"]]["forward_ms"]
        assert ratio == pytest.approx(fwd["4"]["median"] / fwd["1"]["median"])
        a = p["alpha_fit"]
        assert a == pytest.approx(_specrt.alpha_from_tokens_per_round(e, k))
        assert _specrt.expected_tokens(a, k) == pytest.approx(e, rel=1e-6)
        assert p["predicted_speedup"] == pytest.approx(_specrt.speedup(a, k, c_q, c_p, c_verify=ratio * c_p))
        # The same figure written out: c_p E / (K c_q + c_verify(K)).
        assert p["predicted_speedup"] == pytest.approx(c_p * e / (k * c_q + ratio * c_p), rel=1e-6)
        assert p["predicted_speedup_seed"] == pytest.approx(_specrt.speedup(a, k, c_q, c_p))
        assert p["measured_over_predicted"] == pytest.approx(p["speedup"]["median"] / p["predicted_speedup"])
        r = p["round_ms"]
        assert r["draft"] + r["target"] + r["other"] == pytest.approx(r["measured"])
        assert r["model"] == pytest.approx(k * c_q + ratio * c_p)


def test_verify_costs_cover_every_k_and_k0_is_one(report) -> None:
    for c in report["verify_costs"].values():
        assert set(c["c_verify_ratio"]) == {"0", "1", "3"}
        assert c["c_verify_ratio"]["0"] == 1.0
        assert set(c["forward_ms"]) == {"1", "2", "4"}
        assert all(s["n"] == 2 for s in c["forward_ms"].values())


def test_sweeps_have_every_point_and_a_model_curve(report) -> None:
    sw = report["sweeps"]
    (entry,) = sw["k_sweep"]["prompts"]
    assert entry["id"] == "raw"
    assert [pt["k"] for pt in entry["points"]] == [0, 1, 3]
    k0 = entry["points"][0]
    assert k0["alpha_fit"] is None and k0["predicted_speedup"] == 1.0 and k0["acceptance_rate"] is None
    assert [c["k"] for c in entry["model_curve"]] == [0, 1, 3]
    assert entry["alpha_ref"] == entry["points"][2]["alpha_fit"]
    # The model curve at the reference K reproduces that point's prediction (same a, c_q, c_p, c_verify).
    assert entry["model_curve"][2]["speedup"] == pytest.approx(entry["points"][2]["predicted_speedup"])
    (tentry,) = sw["temperature_sweep"]["prompts"]
    assert [pt["temperature"] for pt in tentry["points"]] == [0.0, 1.0]
    assert all(pt["k"] == 3 and pt["speedup"]["n"] == 3 for pt in tentry["points"])


def test_files_are_written_and_the_table_names_every_prompt(report, tmp_path) -> None:
    paths = report["_paths"]
    data = json.loads(Path(paths["json"]).read_text(encoding="utf-8"))
    assert data["main"]["prompts"][0]["id"] == "raw"
    pytest.importorskip("matplotlib")
    for kind in ("k-sweep", "temperature-sweep"):
        assert Path(paths[kind]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = tmp_path / "table.txt"
    with out.open("w") as f:
        text = bench.render_table(data, use_rich=False, file=f)
    assert text == out.read_text().rstrip("\n")
    for needle in ("raw (a)", "chat", "total all", "mean peer_prompts", "meas/pred"):
        assert needle in text


def test_k0_baseline_shares_one_decoder(tiny_pair) -> None:
    cfg = bench.BenchConfig(
        target=str(tiny_pair["target"]),
        draft=str(tiny_pair["draft"]),
        prompts_file=str(tiny_pair["prompts"]),
        prompt_ids=("raw",),
        max_new_tokens=6,
        repeats=1,
        verify_repeats=1,
        warmup_tokens=0,
        threads=1,
        ignore_eos=True,
        baseline="k0",
        sweeps=False,
        progress=False,
    )
    rep = bench.run_bench(cfg)
    (p,) = rep["main"]["prompts"]
    assert p["greedy_parity"] is True and "sweeps" not in rep
    with pytest.raises(ValueError, match="baseline 'x'"):
        bench.run_bench(bench.BenchConfig(baseline="x"))


def test_predict_matches_the_cost_functions() -> None:
    # a = 0.7, K = 4 -> E = 2.773 (the seed's example); c_q = 1, c_p = 10, c_verify(4) = 1.2 c_p.
    e = _specrt.expected_tokens(0.7, 4)
    out = bench.predict(e, 4, 1.0, 10.0, 1.2)
    assert out["alpha_fit"] == pytest.approx(0.7, abs=1e-9)
    assert out["predicted_speedup"] == pytest.approx(10 * e / (4 * 1 + 12))
    assert out["predicted_speedup_seed"] == pytest.approx(1.981, abs=1e-3)  # the seed's 1.98x
    assert bench.predict(1.0, 0, 0.0, 10.0, 1.0)["predicted_speedup"] == 1.0
    # E outside [1, K + 1] (a truncated last round) is clamped, not an error.
    assert bench.predict(5.5, 4, 1.0, 10.0, 1.0)["alpha_fit"] == pytest.approx(1.0)


def test_spread_ignores_missing_values() -> None:
    assert bench.spread([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert bench.spread([None]) is None


def test_prompt_sets_and_errors(tmp_path, tiny_pair) -> None:
    assert [p.id for p in bench.load_prompts(tiny_pair["prompts"], set_name="sweep")] == ["raw"]
    assert [p.id for p in bench.load_prompts(tiny_pair["prompts"], ids=["chat", "raw"])] == ["chat", "raw"]
    with pytest.raises(ValueError, match=r"prompt set 'nope' is unknown \(expected one of: all, main, sweep\)"):
        bench.load_prompts(tiny_pair["prompts"], set_name="nope")
    with pytest.raises(ValueError, match=r"\['zz'\]"):
        bench.load_prompts(tiny_pair["prompts"], ids=["zz"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"prompts": [{"id": "x", "kind": "prose", "prompt": "a", "messages": []}]}))
    with pytest.raises(ValueError, match="exactly one of 'prompt' and 'messages'"):
        bench.load_prompts(bad)


def test_repository_prompt_set_has_the_peer_prompts_and_every_kind() -> None:
    prompts = bench.load_prompts(REPO / "benches" / "prompts.json", set_name="all")
    peers = {p.peer: p for p in prompts if p.peer}
    assert sorted(peers) == ["a", "b", "c", "d"]
    assert {p.kind for p in prompts} == {"code_completion", "chat_answer", "code_editing", "prose"}
    assert peers["a"].prompt == 'def quicksort(arr):\n    """Sort a list using quicksort."""\n'
    assert all(peers[x].messages for x in "bcd")
    code = peers["c"].messages[0]["content"].split("```python\n", 1)[1].split("\n```", 1)[0]
    assert len(code.splitlines()) == 40
    for name in ("main", "peers", "sweep", "quick", "edit", "copyless"):
        assert bench.load_prompts(REPO / "benches" / "prompts.json", set_name=name)


def test_code_editing_set_holds_whole_files_with_the_named_change_target() -> None:
    # The prompt-lookup bench (#7): a file of 60+ lines in the prompt, a small change asked, the whole file back.
    edits = bench.load_prompts(REPO / "benches" / "prompts.json", set_name="edit")
    assert len(edits) >= 3 and all(p.kind == "code_editing" and p.messages for p in edits)
    for p in edits:
        text = p.messages[0]["content"]
        ask, code = text.split("```python\n", 1)
        code = code.rsplit("\n```", 1)[0]
        assert len(code.splitlines()) >= 60, p.id
        assert "whole updated file" in ask
        named = [w.strip("`") for w in ask.split() if w.startswith("`")]
        assert any(n.split("(")[0].split("=")[0].split(".")[0] in code for n in named), (p.id, named)


def test_peer_prompt_token_counts_match_peers_md() -> None:
    from specrt.folder_text import folder_text
    from specrt.models import cache_dir

    folder = cache_dir() / "models" / "qwen2.5-coder-1.5b-instruct" / "fp32"
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("Qwen2.5-Coder-1.5B not converted in the cache")
    tokenizer, template = folder_text(folder)
    want = {"a": 14, "b": 53, "c": 387, "d": 39}
    for p in bench.load_prompts(REPO / "benches" / "prompts.json", set_name="peers"):
        if p.messages:
            ids = tokenizer.encode(template.render(list(p.messages), True), add_special_tokens=False)
        else:
            ids = tokenizer.encode(p.prompt)
        assert len(ids.ids) == want[p.peer], p.id


def test_cli_options_become_a_config() -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    cfg = bench.config_from_args(parser.parse_args(["--quick", "-k", "auto", "--prompts", "x,y", "--k-sweep", "1,2"]))
    assert cfg.k == "auto" and cfg.prompt_ids == ("x", "y") and cfg.k_sweep == (1, 2)
    assert cfg.max_new_tokens == 32 and cfg.prompt_set == "quick"  # --quick defaults kept
    cfg = bench.config_from_args(parser.parse_args(["--max-new-tokens", "16", "--no-sweeps", "--temperatures", "0,1"]))
    assert cfg.max_new_tokens == 16 and not cfg.sweeps and cfg.temperatures == (0.0, 1.0) and cfg.repeats == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["-k", "many"])
    assert bench.config_from_args(parser.parse_args([])).dtype == "fp32"
    assert bench.config_from_args(parser.parse_args(["--dtype", "int4"])).dtype == "int4"
    with pytest.raises(SystemExit):
        parser.parse_args(["--dtype", "int3"])


def test_peers_that_cannot_run_are_recorded_not_raised(tiny_pair, tmp_path) -> None:
    missing = str(tmp_path / "no-python")
    cfg = bench.BenchConfig(
        peers=("hf", "genai", "vllm"), genai_python=missing, hf_python=missing, out_dir=str(tmp_path)
    )
    out = bench.run_peers(cfg, tiny_pair["target"], tiny_pair["draft"], [], {})
    assert out["hf"]["status"] == "skipped" and "no-python" in out["hf"]["reason"]
    assert out["genai"]["status"] == "skipped" and "no-python" in out["genai"]["reason"]
    assert out["vllm"]["status"] == "error" and "'vllm'" in out["vllm"]["reason"]
    cfg = bench.BenchConfig(peers=("llama.cpp",), llama_cpp_bin=str(tmp_path / "no-bin"), out_dir=str(tmp_path))
    out = bench.run_peers(cfg, tiny_pair["target"], tiny_pair["draft"], [], {}, {})
    assert out["llama.cpp"]["status"] == "skipped" and "setup_llama_cpp.sh" in out["llama.cpp"]["reason"]
    assert any("peer llama.cpp will be skipped" in w for w in bench.peer_warnings(cfg))
    # An interpreter that exists, but models without a cached GGUF source (the tiny pair is built by the tests).
    cfg = bench.BenchConfig(peers=("hf",), hf_python=sys.executable, out_dir=str(tmp_path))
    out = bench.run_peers(cfg, tiny_pair["target"], tiny_pair["draft"], [], {})
    assert out["hf"]["status"] == "skipped" and "no cached GGUF source for the target and draft" in out["hf"]["reason"]
    cfg = bench.BenchConfig(peers=("hf",), hf_python=sys.executable, dtype="int4", out_dir=str(tmp_path))
    out = bench.run_peers(cfg, tiny_pair["target"], tiny_pair["draft"], [], {})
    assert out["hf"]["status"] == "skipped" and "'int4'" in out["hf"]["reason"]


GENAI_PYTHON = REPO / "benches" / "out" / "venv-genai" / "bin" / "python"


@pytest.mark.skipif(not GENAI_PYTHON.exists(), reason="no onnxruntime-genai venv (benches/README.md sets one up)")
def test_genai_peer_runs_our_onnx_files_and_matches_specrt_tokens(tiny_pair, tmp_path) -> None:
    prompts = bench.load_prompts(tiny_pair["prompts"], ids=["raw"])
    ids = [5, 6, 7, 8, 9]
    cfg = bench.BenchConfig(
        k=3, max_new_tokens=10, repeats=1, warmup_tokens=1, threads=1, peers=("genai",), out_dir=str(tmp_path)
    )
    out = bench.run_peers(cfg, tiny_pair["target"], tiny_pair["draft"], prompts, {"raw": ids})
    g = out["genai"]
    assert g["status"] == "ok", g.get("stderr_tail")
    assert g["onnxruntime_genai"].startswith("0.18")
    p = g["prompts"]["raw"]
    assert p["greedy_parity"] is True and p["speculative_stats"][0]["draft_forward_passes"] > 0
    ref = specrt.Decoder(tiny_pair["target"], max_seq_len=64).generate(ids, max_new_tokens=10, temperature=0)
    assert p["token_ids"]["target_only"] == ref.token_ids


def test_bad_peer_names_and_hf_modes_fail_before_anything_runs(capsys) -> None:
    cases = [
        (
            bench.BenchConfig(peers=("genai", "vllm")),
            r"peers \['vllm'\] are unknown \(expected some of: genai, hf, llama\.cpp\)",
        ),
        (bench.BenchConfig(hf_modes=("assisted", "bogus")), r"hf modes \['bogus'\] are invalid"),
        (bench.BenchConfig(hf_modes=()), r"hf modes \[\] are invalid"),
        (bench.BenchConfig(baseline="none"), r"baseline 'none' is invalid"),
    ]
    for cfg, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            bench.validate_config(cfg)
        with pytest.raises(ValueError, match=pattern):  # before any model is resolved or loaded
            bench.run_bench(replace(cfg, target="no-such-model"))
    bench.validate_config(bench.BenchConfig(peers=("hf", "genai"), hf_modes=bench.HF_MODES))
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert bench.run_cli(parser.parse_args(["--peers", "genai,vllm", "--target", "no-such-model"])) == 2
    err = capsys.readouterr().err
    assert "specrt bench: error: peers ['vllm'] are unknown" in err and "Traceback" not in err


def test_peer_warnings_and_notes_say_why_a_peer_gave_nothing(tmp_path) -> None:
    missing = str(tmp_path / "no-python")
    cfg = bench.BenchConfig(peers=("hf", "genai"), dtype="int4", hf_python=missing, genai_python=missing)
    w = bench.peer_warnings(cfg)
    assert any("peer hf will be skipped: no interpreter at" in x and "setup_hf_venv.sh" in x for x in w)
    assert any("peer genai will be skipped: no interpreter" in x for x in w)
    assert any("float32 only (dtype 'int4')" in x for x in w)
    assert bench.peer_warnings(bench.BenchConfig(hf_modes=("target_only",))) == [
        "--hf-modes has no effect without --peers hf"
    ]
    assert bench.peer_warnings(bench.BenchConfig(peers=("hf",), hf_python=sys.executable)) == []
    spread = {"median": 2.5, "min": 2.5, "max": 2.5, "n": 1}
    report = {
        "main": {"prompts": []},
        "peers": {
            "genai": {
                "status": "error",
                "returncode": 1,
                "stderr_tail": "Traceback ...\n  raise X\nValueError: bad\n\n",
            },
            "hf": {
                "status": "ok",
                "k": 4,
                "modes": ["target_only"],
                "prompts": {"p": {"target_only": {"decode_tokens_per_s": spread}}},
            },
        },
    }
    _, rows, notes = bench.report._peer_rows(report)
    assert rows == []
    assert notes == [
        "peer genai: error: ValueError: bad (stderr in the JSON)",
        "peer hf: target-only decode tok/s (no speculative mode was asked for): p 2.50",
    ]


def _fake_llama_cpp(bin_dir: Path, log: Path) -> None:
    """Stand-ins for llama-bench and llama-speculative-simple that print what the real ones print (their formats as
    of llama-cpp-python 0.3.36's llama.cpp) and log their arguments."""
    bin_dir.mkdir()
    bench_json = '[{"build_commit": "abc1234", "build_number": 1, "n_gen": 16, "n_depth": 0, "avg_ts": 10.0}]'
    spec_log = (
        "encoded   12 tokens in    0.100 seconds, speed:  120.000 t/s\\n"
        "decoded   16 tokens in    1.000 seconds, speed:   16.000 t/s\\n\\n"
        "n_draft   = 3\\nn_predict = 16\\nn_drafted = 12\\nn_accept  = 9\\naccept    = 75.000%%\\n"
    )
    for name, body in (
        ("llama-bench", f"echo '{bench_json}'"),
        ("llama-speculative-simple", f"printf '{spec_log}' >&2; echo ' hello world'"),
    ):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n{body}\n', encoding="utf-8")
        script.chmod(0o755)


def test_llama_cpp_peer_parses_its_tools_and_reports_beside_specrt(tiny_pair, tmp_path, monkeypatch) -> None:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    _fake_llama_cpp(bin_dir, log)
    monkeypatch.setattr(bench.peers, "gguf_source", lambda path: Path(path) / "fake.gguf")
    prompts = bench.load_prompts(tiny_pair["prompts"], ids=["raw", "chat"])
    cfg = bench.BenchConfig(
        k=3, max_new_tokens=16, repeats=2, peers=("llama.cpp",), llama_cpp_bin=str(bin_dir), out_dir=str(tmp_path)
    )
    texts = {"raw": "def add(a, b):", "chat": "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"}
    out = bench.run_peers(
        cfg, tiny_pair["target"], tiny_pair["draft"], prompts, {"raw": [1] * 5, "chat": [2] * 9}, texts
    )
    g = out["llama.cpp"]
    assert g["status"] == "ok", g.get("stderr_tail")
    assert g["versions"]["build_commit"] == "abc1234" and g["k"] == 3
    p = g["prompts"]["chat"]
    assert p["target_only"]["decode_tokens_per_s"]["median"] == 10.0
    assert p["speculative"]["decode_tokens_per_s"]["median"] == 16.0
    assert p["speedup"]["median"] == pytest.approx(1.6) and p["acceptance_rate"]["median"] == pytest.approx(0.75)
    assert p["n_drafted"] == 24 and p["text"] == "hello world"
    calls = log.read_text(encoding="utf-8").splitlines()
    assert len(calls) == 8  # 2 prompts x 2 repetitions x (bench + speculative)
    # Target-only at the prompt's depth (specrt's token count), greedy speculative with K = --spec-draft-n-max.
    assert any("-d 9" in c and c.startswith("llama-bench") and "-n 16" in c for c in calls)
    spec = [c for c in calls if c.startswith("llama-speculative-simple")]
    assert all("--temp 0" in c and "--spec-type draft-simple --spec-draft-n-max 3" in c for c in spec)
    assert all(str(tiny_pair["draft"] / "fake.gguf") in c for c in spec)
    _, rows, _ = bench.report._peer_rows({"main": {"prompts": []}, "peers": out})
    assert [r[1] for r in rows] == ["llama.cpp K=3", "llama.cpp K=3"]


def test_llama_cpp_peer_runs_the_real_tools_on_the_gguf_source(tmp_path) -> None:
    from specrt.models import cache_dir

    cfg = bench.BenchConfig(k=3, max_new_tokens=8, repeats=1, peers=("llama.cpp",), out_dir=str(tmp_path))
    folder = cache_dir() / "models" / "smollm2-135m-instruct" / "fp32"
    if not (bench.peers.llama_cpp_bin(cfg) / "llama-speculative-simple").is_file():
        pytest.skip("llama.cpp is not built (bash benches/peers/setup_llama_cpp.sh)")
    if bench.gguf_source(folder) is None:
        pytest.skip("SmolLM2 fp32 and its GGUF are not in the cache (specrt models pull smollm2-135m-instruct)")
    text = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    prompts = [bench.Prompt(id="chat", kind="chat_answer", prompt=text)]
    # Target and draft are the same GGUF: most draft tokens are accepted (not all: llama.cpp's multi-token target
    # pass and single-token draft pass use different kernels, and near-ties in Q4_1 can flip between them).
    out = bench.run_peers(cfg, folder, folder, prompts, {"chat": list(range(16))}, {"chat": text})
    g = out["llama.cpp"]
    assert g["status"] == "ok", g.get("stderr_tail")
    p = g["prompts"]["chat"]
    assert p["target_only"]["decode_tokens_per_s"]["median"] > 0 and p["speculative"]["n_emitted"]["median"] >= 8
    assert p["n_drafted"] > 0 and p["acceptance_rate"]["median"] >= 0.5
    assert "Paris" in p["text"] and "<|im_start|>" not in p["text"]


HF_PYTHON = REPO / "benches" / "out" / "venv-hf" / "bin" / "python"


@pytest.mark.skipif(not HF_PYTHON.exists(), reason="no torch + transformers venv (benches/peers/setup_hf_venv.sh)")
def test_hf_peer_runs_the_gguf_source_and_matches_specrt_tokens(tmp_path) -> None:
    from specrt.models import cache_dir

    folder = cache_dir() / "models" / "smollm2-135m-instruct" / "fp32"
    if bench.gguf_source(folder) is None:
        pytest.skip("SmolLM2 fp32 and its GGUF are not in the cache (specrt pull smollm2-135m-instruct)")
    ids = [1, 504, 3458, 282, 4235, 314]
    prompts = [bench.Prompt(id="raw", kind="prose", prompt="x")]
    cfg = bench.BenchConfig(
        k=3, max_new_tokens=10, repeats=1, warmup_tokens=1, threads=1, peers=("hf",), out_dir=str(tmp_path)
    )
    # Target and draft are the same model: greedy drafts are the target's own tokens.
    out = bench.run_peers(cfg, folder, folder, prompts, {"raw": ids})
    h = out["hf"]
    assert h["status"] == "ok", h.get("stderr_tail")
    assert h["cuda_available"] is False and h["modes"] == ["target_only", "assisted"]
    p = h["prompts"]["raw"]
    assert p["assisted"]["greedy_parity"] is True
    assert p["runs"]["assisted"][0]["draft_passes"] > 0 and p["assisted"]["mean_tokens_per_round"]["median"] > 1
    ref = specrt.Decoder(folder, max_seq_len=64).generate(ids, max_new_tokens=10, temperature=0, ignore_eos=True)
    assert p["token_ids"]["target_only"] == ref.token_ids[: len(p["token_ids"]["target_only"])]


def test_auto_k_predicts_at_the_rounded_mean_k(tiny_pair) -> None:
    cfg = bench.BenchConfig(
        target=str(tiny_pair["target"]),
        draft=str(tiny_pair["draft"]),
        prompts_file=str(tiny_pair["prompts"]),
        prompt_ids=("raw",),
        k="auto",
        max_new_tokens=12,
        repeats=1,
        verify_repeats=1,
        warmup_tokens=0,
        threads=1,
        ignore_eos=True,
        sweeps=False,
        progress=False,
    )
    rep = bench.run_bench(cfg)
    assert set(rep["verify_costs"]["raw"]["c_verify_ratio"]) == {str(k) for k in range(9)}
    (p,) = rep["main"]["prompts"]
    assert p["k_model"] == max(1, round(p["k_mean"]))
    assert p["c_verify_ratio"] == rep["verify_costs"]["raw"]["c_verify_ratio"][str(p["k_model"])]
    assert p["greedy_parity"] is True


def test_bench_int4_genai_folder_leaves_the_model_folder_alone(tiny_pair) -> None:
    """``benches/bench_int4.py``'s genai folder links to the model's files and writes its own ``genai_config.json``
    and ``tokenizer_config.json``: never through a link into the model folder (it once overwrote the cached models'
    ``tokenizer_config.json``, and transformers then read no special tokens from them)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_int4", REPO / "benches" / "bench_int4.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = tiny_pair["target"]
    before = {f.name: f.read_bytes() for f in model.iterdir() if f.suffix == ".json"}
    assert "tokenizer_config.json" in before
    out = mod.genai_folder(model, threads=1, max_length=64)
    after = {f.name: f.read_bytes() for f in model.iterdir() if f.suffix == ".json"}
    assert after == before
    for name in ("genai_config.json", "tokenizer_config.json"):
        assert not (out / name).is_symlink() and (out / name).is_file()
    assert (out / "model.onnx").resolve() == (model / "model.onnx").resolve()
