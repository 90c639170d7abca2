"""``specrt bench --suite spec-bench`` (``specrt.bench.spec_bench``): the shipped questions, their selection, the
settings' checks, and a run on SmolLM2-135M (fp32 target, its int4 copy as draft; skipped when the cache has none):
the report's shape, greedy outputs equal to target-only for every method, the second turn's history, and the
equality check failing where an output was perturbed.

Timings on SmolLM2 on a shared machine mean nothing; nothing here asserts on them.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import io
import json
from pathlib import Path

import pytest

from specrt import bench
from specrt.bench import spec_bench
from specrt.bench.report import render_table
from specrt.models import cache_dir
from test_bench import _fake_llama_cpp

SMOL = cache_dir() / "models" / "smollm2-135m-instruct"
#: The run's selection: a two-turn MT-bench category and a single-turn one, two questions each (~1 min on 2 cores).
CATEGORIES = ("writing", "qa")


def test_the_shipped_questions_are_spec_bench_s_480_in_13_categories() -> None:
    path = spec_bench.questions_path()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == spec_bench.SOURCE["sha256"]
    license_text = (path.parent / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert spec_bench.SOURCE["commit"] in (path.parent / "NOTICE").read_text(encoding="utf-8")
    qs = spec_bench.load_questions()
    assert len(qs) == 480
    counts = {c: sum(q.category == c for q in qs) for c in spec_bench.CATEGORIES}
    assert counts == {c: 10 if c in spec_bench.MT_BENCH_CATEGORIES else 80 for c in spec_bench.CATEGORIES}
    assert all(len(q.turns) == (2 if q.category in spec_bench.MT_BENCH_CATEGORIES else 1) for q in qs)
    assert [q.question_id for q in qs] == list(range(81, 561))


def test_selection_takes_each_category_s_first_questions_in_category_order() -> None:
    qs = spec_bench.load_questions()
    picked = spec_bench.select_questions(qs, 2, ("rag", "writing"))
    assert [(q.category, q.question_id) for q in picked] == [
        ("writing", 81),
        ("writing", 82),
        ("rag", 481),
        ("rag", 482),
    ]
    assert len(spec_bench.select_questions(qs, None)) == 480
    assert len(spec_bench.select_questions(qs, 1)) == 13
    with pytest.raises(ValueError, match=r"per_category 0 is invalid \(expected an integer >= 1, or None / 'all'\)"):
        spec_bench.select_questions(qs, 0)
    with pytest.raises(ValueError, match=r"categories \['poetry'\] are unknown \(expected some of: writing, roleplay"):
        spec_bench.select_questions(qs, 1, ("poetry",))


def test_bad_suite_settings_are_refused_naming_the_field() -> None:
    cases = [
        ({"suite": "humaneval"}, r"suite 'humaneval' is unknown \(expected one of: spec-bench\)"),
        (
            {"methods": ("draft", "medusa")},
            r"methods \['draft', 'medusa'\] are invalid \(expected distinct names among",
        ),
        ({"methods": ()}, r"methods \[\] are invalid"),
        ({"per_category": -1}, r"per_category -1 is invalid"),
        ({"categories": ("poetry",)}, r"categories \['poetry'\] are unknown"),
        ({"temperature": -0.5}, r"temperature -0.5 is invalid \(expected >= 0; 0 = greedy\)"),
        ({"random_shapes": "tiny"}, r"suite 'spec-bench' runs real models only"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message):
            bench.validate_config(bench.BenchConfig.spec_bench(**overrides))


def test_the_cli_reads_the_suite_options_into_the_config() -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    cfg = bench.config_from_args(parser.parse_args(["--suite", "spec-bench"]))
    assert (cfg.suite, cfg.per_category, cfg.max_new_tokens, cfg.categories) == ("spec-bench", 1, 48, ())
    assert cfg.methods == spec_bench.METHODS and cfg.temperature == 0 and cfg.coupled
    args = ["--suite", "spec-bench", "--per-category", "all", "--categories", "writing,qa", "--methods", "ngram"]
    args += ["--temperature", "1", "--no-coupled", "--max-new-tokens", "20", "-k", "3"]
    cfg = bench.config_from_args(parser.parse_args(args))
    assert (cfg.per_category, cfg.categories, cfg.methods) == (None, ("writing", "qa"), ("ngram",))
    assert (cfg.temperature, cfg.coupled, cfg.max_new_tokens, cfg.k) == (1.0, False, 20, 3)
    assert bench.config_from_args(parser.parse_args([])).suite is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--suite", "spec-bench", "--per-category", "0"])


def test_quick_and_suite_together_are_refused(capsys) -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert bench.run_cli(parser.parse_args(["--suite", "spec-bench", "--quick"])) == 2
    assert "--quick does not apply to --suite spec-bench" in capsys.readouterr().err


def _config(out_dir: Path, **overrides) -> bench.BenchConfig:
    base = {
        "target": str(SMOL / "fp32"),
        "draft": str(SMOL / "int4"),
        "per_category": 2,
        "categories": CATEGORIES,
        "max_new_tokens": 12,
        "warmup_tokens": 2,
        "threads": 2,
        "progress": False,
        "out_dir": str(out_dir),
        "name": "sb",
    }
    return bench.BenchConfig.spec_bench(**{**base, **overrides})


@pytest.fixture(scope="module")
def greedy_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The suite on SmolLM2 (2 questions of writing and of qa, 12 new tokens per turn, all methods, greedy), with a
    stand-in llama.cpp as peer; saved as the CLI saves it."""
    if not (SMOL / "fp32" / "model.onnx").is_file() or not (SMOL / "int4" / "model.onnx").is_file():
        pytest.skip(
            "SmolLM2 fp32 and int4 are not in the cache (specrt models pull smollm2-135m-instruct [--dtype int4])"
        )
    out = tmp_path_factory.mktemp("spec_bench")
    bin_dir = out / "llama-bin"
    _fake_llama_cpp(bin_dir, out / "llama-calls.log")
    cfg = _config(out, peers=("llama.cpp",), llama_cpp_bin=str(bin_dir))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench.peers, "gguf_source", lambda path: Path(path) / "fake.gguf")
        report = bench.run_bench(cfg)
    paths = bench.save(report, cfg)
    return {"report": report, "paths": paths, "json": json.loads(paths["json"].read_text(encoding="utf-8"))}


@pytest.mark.model
def test_the_suite_reports_every_method_per_category_and_overall(greedy_run) -> None:
    rep = greedy_run["json"]
    assert rep["suite"] == "spec-bench" and rep["schema"] == bench.SCHEMA
    assert rep["dataset"]["question_ids"] == {"writing": [81, 82], "qa": [321, 322]}
    assert (rep["dataset"]["n_questions"], rep["dataset"]["n_turns"]) == (4, 6)
    assert rep["dataset"]["commit"] == spec_bench.SOURCE["commit"]
    methods = list(spec_bench.METHODS)
    assert list(rep["decoding"]["methods"]) == methods
    assert rep["decoding"]["methods"]["ngram+draft"] == {"proposer": "ngram+draft", "num_speculative_tokens": 4}
    assert rep["decoding"]["outputs_compared"] is True and rep["decoding"]["prefix_caching"] is False
    sb = rep["spec_bench"]
    assert list(sb["categories"]) == list(CATEGORIES)
    for group, n_q, n_turns in [
        (sb["categories"]["writing"], 2, 4),
        (sb["categories"]["qa"], 2, 2),
        (sb["overall"], 4, 6),
    ]:
        assert list(group) == methods
        for m, fig in group.items():
            assert (fig["n_questions"], fig["n_turns"]) == (n_q, n_turns)
            assert fig["decode_tokens_per_s"] > 0 and fig["n_emitted"] > 0
            assert (
                fig["speedup"]["n"] == n_q
                and fig["speedup"]["min"] <= fig["speedup"]["median"] <= fig["speedup"]["max"]
            )
            if m == "target_only":
                assert fig["outputs_equal"] is None and fig["speedup"]["median"] == 1.0
                assert fig["n_drafted"] == 0 and fig["acceptance_rate"] is None and fig["mean_tokens_per_round"] == 1.0
            else:
                # Greedy: every method's output is target-only's, token for token, on every turn.
                assert fig["outputs_equal"] == {"n_equal": n_q, "n": n_q, "mismatches": []}
                assert fig["mean_tokens_per_round"] >= 1.0
    # The pooled figures are sums of the recorded Stats.
    draft_turns = [t for q in sb["questions"] for t in q["runs"]["draft"]]
    assert sb["overall"]["draft"]["n_accepted"] == sum(t["stats"]["n_accepted"] for t in draft_turns)
    assert sb["overall"]["draft"]["acceptance_rate"] == pytest.approx(
        sum(t["stats"]["n_accepted"] for t in draft_turns) / sum(t["stats"]["n_drafted"] for t in draft_turns)
    )
    assert sb["overall"]["auto_k"]["n_drafted"] > 0  # auto K did draft
    assert greedy_run["paths"]["json"].name == "sb.json"


@pytest.mark.model
def test_the_second_turn_carries_target_only_s_first_answer(greedy_run) -> None:
    from specrt.folder_text import folder_text

    tokenizer, template = folder_text(SMOL / "fp32")
    questions = {q.question_id: q for q in spec_bench.load_questions()}
    for rec in greedy_run["json"]["spec_bench"]["questions"]:
        q = questions[rec["question_id"]]
        answers = [t["text"] for t in rec["runs"]["target_only"]]
        for turn in range(len(q.turns)):
            messages = spec_bench.messages_for(q, turn, answers)
            ids = tokenizer.encode(template.render(messages, True), add_special_tokens=False).ids
            assert {m: runs[turn]["n_prompt_tokens"] for m, runs in rec["runs"].items()} == dict.fromkeys(
                rec["runs"], len(ids)
            )
        if len(q.turns) == 2:
            assert [m["role"] for m in spec_bench.messages_for(q, 1, answers)] == ["user", "assistant", "user"]
            assert spec_bench.messages_for(q, 1, answers)[1]["content"] == answers[0] != ""


@pytest.mark.model
def test_the_table_the_plot_and_the_peer_summary(greedy_run) -> None:
    rep = greedy_run["report"]
    text = render_table(rep, use_rich=False, file=io.StringIO())
    for title in ("decode tokens/s", "speedup over target-only", "tokens per round E", "outputs equal to target-only"):
        assert title in text
    assert "draft K=4" in text and "auto K" in text and "overall" in text and "outputs differ" not in text
    # The stand-in llama.cpp got every turn as rendered chat text (second turns with the first answer in them).
    peer = rep["peers"]["llama.cpp"]
    assert peer["status"] == "ok", peer.get("stderr_tail")
    assert sorted(peer["prompts"]) == ["q321-t1", "q322-t1", "q81-t1", "q81-t2", "q82-t1", "q82-t2"]
    summary = rep["peer_summary"]["llama.cpp K=4"]
    assert summary["overall"]["n"] == 4 and summary["overall"]["median"] == pytest.approx(1.6)
    assert summary["target_only_same_tokens_as_specrt"] is None  # llama.cpp reports no token ids
    assert "peers: speculative over their own target-only" in text
    # Absolute decode tokens/s of both peer modes, tokens over seconds summed (the stand-in's rates are 1.6x apart).
    rates = summary["decode_tokens_per_s"]["overall"]
    assert rates["target_only"] > 0 and rates["speculative"] / rates["target_only"] == pytest.approx(1.6)
    assert set(summary["decode_tokens_per_s"]) == {*rep["spec_bench"]["categories"], "overall"}
    assert "decode tokens/s beside the peers" in text
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "speedup" not in greedy_run["paths"]
    else:
        png = greedy_run["paths"]["speedup"]
        assert png.name == "sb-speedup.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.model
def test_the_equality_check_reports_a_perturbed_output(greedy_run) -> None:
    records = copy.deepcopy(greedy_run["json"]["spec_bench"]["questions"])
    for r in records:
        r.pop("figures")
    methods = list(spec_bench.METHODS)
    # A deliberately wrong reference: target-only's second answer to question 82 changed at token 3, and its answer
    # to question 321 cut short after 2 tokens.
    q82 = next(r for r in records if r["question_id"] == 82)
    q82["runs"]["target_only"][1]["token_ids"][3] += 1
    q321 = next(r for r in records if r["question_id"] == 321)
    del q321["runs"]["target_only"][0]["token_ids"][2:]
    out = spec_bench.summarize(records, methods, compare=True)
    for m in methods[1:]:
        assert out["categories"]["writing"][m]["outputs_equal"] == {
            "n_equal": 1,
            "n": 2,
            "mismatches": [{"question_id": 82, "turn": 2, "position": 3}],
        }
        assert out["overall"][m]["outputs_equal"]["mismatches"] == [
            {"question_id": 82, "turn": 2, "position": 3},
            {"question_id": 321, "turn": 1, "position": 2},
        ]
    report = {**greedy_run["json"], "spec_bench": {"questions": records, **out}, "peer_summary": {}}
    text = render_table(report, use_rich=False, file=io.StringIO())
    assert "outputs differ from target-only: draft K=4: q82 turn 2 at token 3, q321 turn 1 at token 2" in text
    # Sampled without coupling there is nothing to compare: the column says so.
    out = spec_bench.summarize(records, methods, compare=False)
    assert all(f["outputs_equal"] is None for f in out["overall"].values())
    decoding = {**greedy_run["json"]["decoding"], "outputs_compared": False, "why_not_compared": "sampled"}
    text = render_table(
        {**report, "decoding": decoding, "spec_bench": {"questions": records, **out}}, file=io.StringIO()
    )
    assert spec_bench.NOT_COMPARED in text and "outputs differ" not in text


@pytest.mark.model
def test_coupled_sampling_keeps_outputs_equal_at_temperature_one(tmp_path) -> None:
    if not (SMOL / "int4" / "model.onnx").is_file():
        pytest.skip("SmolLM2 int4 is not in the cache")
    cfg = _config(tmp_path, per_category=1, categories=("qa",), temperature=1.0, seed=7, warmup_tokens=0, plots=False)
    rep = bench.run_bench(cfg)
    assert rep["decoding"]["coupled"] is True
    for m in spec_bench.METHODS[1:]:
        assert rep["spec_bench"]["overall"][m]["outputs_equal"] == {"n_equal": 1, "n": 1, "mismatches": []}
