"""``specrt certify``: the statistics, the certificate on a tiny pair, and a broken sampler it must catch."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from specrt.certify import (
    CertifyConfig,
    certify,
    kolmogorov_pvalue,
    ks_critical,
    ks_statistic,
    pit_values,
    render_report,
)
from specrt.convert import convert
from specrt.convert.tiny import write_tiny_gguf
from specrt.errors import ConfigError


def test_kolmogorov_pvalues_match_the_textbook_quantiles() -> None:
    # Asymptotic two-sided quantiles of sqrt(n) D: 1.358 (0.05), 1.628 (0.01), 1.949 (0.001).
    n = 1_000_000
    for lam, p in [(1.358, 0.05), (1.628, 0.01), (1.949, 0.001)]:
        assert kolmogorov_pvalue(lam / math.sqrt(n), n) == pytest.approx(p, rel=0.02)
    assert kolmogorov_pvalue(0.0, 10) == 1.0
    assert ks_critical(0.001, 12_000) == pytest.approx(1.949 / math.sqrt(12_000), rel=0.01)


def test_ks_test_is_calibrated_and_sees_a_small_shift() -> None:
    rng = np.random.default_rng(1)
    pvals = [kolmogorov_pvalue(ks_statistic(rng.random(2000)), 2000) for _ in range(400)]
    # Under the null about 5% of p-values fall below 0.05: binomial(400, 0.05) sd = 4.4; allow 5 sd.
    assert abs(sum(p < 0.05 for p in pvals) - 20) < 22
    shifted = rng.random(12_000) ** 1.1  # sup |G(s) - s| ~ 0.03
    assert kolmogorov_pvalue(ks_statistic(shifted), 12_000) < 1e-3


def test_pit_values_are_uniform_for_exact_samples_and_not_for_biased_ones() -> None:
    rng = np.random.default_rng(2)
    vocab, n = 50, 6000
    logits = rng.normal(size=(n, vocab)) * 2
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    exact = [rng.choice(vocab, p=p) for p in probs]
    assert kolmogorov_pvalue(ks_statistic(pit_values(probs, exact, rng.random(n))), n) > 1e-3
    # Sampling at temperature 0.8 instead of 1: too peaked, a consistent shift towards u ~ 0.
    sharp = np.exp(logits / 0.8) / np.exp(logits / 0.8).sum(1, keepdims=True)
    biased = [rng.choice(vocab, p=p) for p in sharp]
    assert kolmogorov_pvalue(ks_statistic(pit_values(probs, biased, rng.random(n))), n) < 1e-6


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tiny target and a 1-layer draft of the same weights (acceptance well below 0.8 at T = 1)."""
    root = tmp_path_factory.mktemp("certify")
    out = {}
    for name, layers in [("target", 2), ("draft", 1)]:
        gguf = write_tiny_gguf(root / f"{name}.gguf", arch="qwen2", seed=1, n_layers=layers)
        out[name] = str(convert(gguf, root / name, progress=False))
    return out


SETTINGS = [
    {"temperature": 1.0, "num_speculative_tokens": 4},
    {"temperature": 0.7, "top_p": 0.9, "num_speculative_tokens": 3, "repetition_penalty": 1.2},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=["T1", "T0.7-top_p0.9-penalty"])
def test_certificate_passes_a_correct_sampler_and_fails_a_broken_one(pair: dict[str, str], settings: dict) -> None:
    # Default N and alpha; the broken sampler draws recovered tokens from q instead of norm(max(0, p - q)).
    good = certify(CertifyConfig(pair["target"], pair["draft"], settings={**settings, "ignore_eos": True}))
    print(render_report(good))
    assert good.passed and good.n >= 12_000 and good.parity_passed
    assert good.acceptance_rate is not None and good.acceptance_rate <= 0.8
    assert good.shape_logit_diff is not None and good.shape_u_bound < good.critical_d / 10
    bad = certify(
        CertifyConfig(
            pair["target"], pair["draft"], settings={**settings, "ignore_eos": True}, fault="residual_from_draft"
        )
    )
    print(render_report(bad))
    assert not bad.passed and bad.p_value < bad.alpha
    assert bad.acceptance_rate <= 0.8


def test_certificate_covers_coupled_sampling(pair: dict[str, str]) -> None:
    r = certify(
        CertifyConfig(
            pair["target"],
            pair["draft"],
            settings={"temperature": 1.0, "num_speculative_tokens": 4, "coupled": True, "ignore_eos": True},
            n=4000,
        )
    )
    assert r.passed, render_report(r)


# A regex over the tiny byte-level vocabulary with forced stretches (", " then "x") and free ones; ignore_eos keeps
# it going (it accepts after each ", " but never completes).
CONSTRAINED = {"temperature": 1.0, "num_speculative_tokens": 4, "ignore_eos": True, "regex": "(x[a-z]{1,3}, )+"}


def test_certificate_covers_structured_output_and_needs_the_masks(
    pair: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import specrt.certify

    cfg = CertifyConfig(pair["target"], pair["draft"], settings=CONSTRAINED, n=4000)
    good = certify(cfg)
    assert good.passed and good.parity_passed and good.n >= 4000, render_report(good)
    # The same test catches the broken sampler under a constraint...
    bad = certify(
        CertifyConfig(pair["target"], pair["draft"], settings=CONSTRAINED, n=4000, fault="residual_from_draft")
    )
    assert not bad.passed and bad.p_value < bad.alpha, render_report(bad)
    # ... and scoring a constrained output against the unmasked target distribution fails: the masks reach the score.
    real = specrt.certify._processing
    monkeypatch.setattr(specrt.certify, "_processing", lambda dec, s: (real(dec, s)[0], None))
    unmasked = certify(cfg)
    assert not unmasked.passed and unmasked.p_value < unmasked.alpha, render_report(unmasked)


def test_certify_cli_takes_the_constraint_flags(pair: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    from specrt.cli import main

    args = ["certify", "--target", pair["target"], "--draft", pair["draft"], "--temperature", "1", "--n", "1000"]
    assert main([*args, "--ignore-eos", "--regex", CONSTRAINED["regex"]]) == 0
    out = capsys.readouterr().out
    assert "losslessness certificate: PASSED" in out and "regex=" in out
    assert main([*args, "--regex", "(", "--max-new-tokens", "8"]) == 2
    assert 'error: --regex "(" is invalid' in capsys.readouterr().err


def test_bad_certificate_settings_are_clear_errors(pair: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="n 10 is invalid"):
        certify(CertifyConfig(pair["target"], pair["draft"], n=10))
    with pytest.raises(ConfigError, match="alpha 2 is invalid"):
        certify(CertifyConfig(pair["target"], pair["draft"], alpha=2))
    with pytest.raises(ConfigError, match="max_new_tokens 0 is invalid"):
        certify(CertifyConfig(pair["target"], pair["draft"], max_new_tokens=0))
    with pytest.raises(ConfigError, match="temperature 0 with the parity check off tests nothing"):
        certify(CertifyConfig(pair["target"], pair["draft"], settings={"temperature": 0.0}, parity=False))


def test_certify_cli_exit_codes(pair: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specrt.cli import main

    args = ["certify", "--target", pair["target"], "--draft", pair["draft"], "--temperature", "1", "--n", "2000"]
    assert main([*args, "--ignore-eos", "--json", str(tmp_path / "r.json")]) == 0
    assert "losslessness certificate: PASSED" in capsys.readouterr().out
    assert (tmp_path / "r.json").is_file()
    assert main([*args, "--ignore-eos", "--fault", "residual_from_draft"]) == 1
    assert "FAILED" in capsys.readouterr().out


def test_certify_checks_settings_before_loading_and_reports_progress_once_loaded(
    pair: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import specrt.generate
    from specrt.cli import main

    loads = []
    real = specrt.generate.Decoder
    monkeypatch.setattr(specrt.generate, "Decoder", lambda *a, **k: loads.append(a) or real(*a, **k))
    # A bad setting is refused before any model loads (a model name would be pulled first).
    with pytest.raises(ConfigError, match=r"top_p 1\.5 is invalid"):
        certify(CertifyConfig(pair["target"], pair["draft"], settings={"top_p": 1.5}))
    with pytest.raises(TypeError, match=r"certify\(\) got an unexpected keyword argument 'max_tokens'"):
        certify(CertifyConfig(pair["target"], pair["draft"], settings={"max_tokens": 4}))
    assert loads == []
    # The CLI says what it loads first; the progress starts at 0 once the models are loaded, before any token.
    calls: list[tuple[int, int]] = []
    r = certify(
        CertifyConfig(pair["target"], pair["draft"], settings={"temperature": 1.0}, n=200, parity=False),
        progress=lambda done, total: calls.append((done, total)),
    )
    assert r.n >= 200 and len(loads) == 1 and calls[0] == (0, 200) and calls[-1] == (200, 200)
    assert main(["certify", "--target", pair["target"], "--draft", pair["draft"], "--n", "100", "--no-parity"]) == 0
    err = capsys.readouterr().err
    assert err.index("specrt certify: loading") < err.index("generating: 0/100 positions")
    # --draft-dtype applies to model names only: a folder with it is a clear error (from the Decoder).
    with pytest.raises(ConfigError, match="draft_dtype 'int4' applies to model names"):
        certify(CertifyConfig(pair["target"], pair["draft"], draft_dtype="int4", n=100))
