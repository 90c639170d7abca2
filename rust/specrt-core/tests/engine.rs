//! The decode loop over mock models: greedy parity with target-only decoding, stops inside an accepted block,
//! statistics, determinism, and the end-to-end distribution at temperature 1.

mod common;

use common::{greedy as greedy_cfg, t1 as t1_cfg};
use specrt_core::testing::MockModel;
use specrt_core::{
    Backend, Engine, FinishReason, GenerationConfig, GenerationOutput, SamplingParams, SpecError,
    TokenSource,
};

const VOCAB: usize = 64;
const MAX_SEQ: usize = 512;

fn target(seed: u64) -> MockModel {
    MockModel::new(VOCAB, MAX_SEQ, seed, 4.0)
}

fn draft(seed: u64, noise: f32) -> MockModel {
    target(seed).with_noise(seed + 1000, noise)
}

fn run(
    t: MockModel,
    d: Option<MockModel>,
    prompt: &[u32],
    cfg: GenerationConfig,
) -> GenerationOutput {
    let mut e = Engine::new(Box::new(t), d.map(|d| Box::new(d) as Box<dyn Backend>)).unwrap();
    e.generate(prompt, cfg, |_| true).unwrap()
}

fn check_stats(out: &GenerationOutput) {
    let s = &out.stats;
    assert_eq!(
        s.n_emitted(),
        out.tokens.len() as u64,
        "emitted = accepted + recovered + bonus"
    );
    assert_eq!(out.sources.len(), out.tokens.len());
    assert_eq!(out.logprobs.len(), out.tokens.len());
    let n_acc = out
        .sources
        .iter()
        .filter(|s| **s == TokenSource::Accepted)
        .count() as u64;
    assert_eq!(n_acc, s.n_accepted);
    assert!(s.n_accepted <= s.n_drafted);
    assert!(out.logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
}

#[test]
fn greedy_speculative_equals_greedy_target_only() {
    let prompt = [3u32, 17, 42, 5];
    for seed in 0..4u64 {
        let reference = run(target(seed), None, &prompt, greedy_cfg(0, 48));
        assert_eq!(reference.tokens.len(), 48);
        for k in [1usize, 3, 8] {
            for noise in [0.0f32, 0.3, 2.0] {
                let out = run(
                    target(seed),
                    Some(draft(seed, noise)),
                    &prompt,
                    greedy_cfg(k, 48),
                );
                assert_eq!(
                    out.tokens, reference.tokens,
                    "seed {seed} k {k} noise {noise}"
                );
                assert_eq!(
                    out.logprobs, reference.logprobs,
                    "seed {seed} k {k} noise {noise}"
                );
                check_stats(&out);
                if noise == 0.0 {
                    assert_eq!(
                        out.stats.n_accepted, out.stats.n_drafted,
                        "identical draft accepts all"
                    );
                }
            }
        }
    }
}

#[test]
fn greedy_parity_holds_with_penalties() {
    let prompt = [1u32, 2, 3, 1, 2, 3];
    let mut cfg = greedy_cfg(0, 40);
    cfg.sampling.repetition_penalty = 1.5;
    cfg.sampling.frequency_penalty = 0.4;
    cfg.sampling.presence_penalty = 0.2;
    let reference = run(target(9), None, &prompt, cfg.clone());
    let plain = run(target(9), None, &prompt, greedy_cfg(0, 40));
    assert_ne!(
        reference.tokens, plain.tokens,
        "the penalties must change this output"
    );
    for k in [1usize, 4, 8] {
        cfg.num_speculative_tokens = k;
        let out = run(target(9), Some(draft(9, 0.5)), &prompt, cfg.clone());
        assert_eq!(out.tokens, reference.tokens, "k {k}");
    }
}

/// A backend wrapper that counts forward calls and tokens fed, shared with the test after the engine takes the box.
struct Counting(MockModel, std::sync::Arc<std::sync::Mutex<(usize, usize)>>);

impl Backend for Counting {
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
    fn max_seq_len(&self) -> usize {
        self.0.max_seq_len()
    }
    fn forward(
        &mut self,
        tokens: &[u32],
        n_past: usize,
        n_logits: usize,
    ) -> specrt_core::Result<&[f32]> {
        let mut c = self.1.lock().unwrap();
        c.0 += 1;
        c.1 += tokens.len();
        drop(c);
        self.0.forward(tokens, n_past, n_logits)
    }
}

#[test]
fn draft_runs_exactly_k_passes_per_round() {
    let counter = std::sync::Arc::new(std::sync::Mutex::new((0usize, 0usize)));
    let d = Counting(draft(5, 0.4), counter.clone());
    let mut e = Engine::new(Box::new(target(5)), Some(Box::new(d))).unwrap();
    let prompt = [7u32, 8, 9];
    e.start(&prompt, greedy_cfg(4, 60)).unwrap();
    let (mut calls_before, mut fed_before) = *counter.lock().unwrap();
    assert_eq!(
        (calls_before, fed_before),
        (0, 0),
        "the prefill does not run the draft (its first drafting pass reads the prompt)"
    );
    let mut n_out = 0;
    let mut drafted_before = false;
    while e.finish_reason().is_none() {
        let out = e.step().unwrap().clone();
        let (calls, fed) = *counter.lock().unwrap();
        assert_eq!(
            calls - calls_before,
            out.n_drafted,
            "one draft pass per draft token"
        );
        // The first pass feeds the unseen committed tokens (the first drafting round: the prompt and the
        // prefill's token; later 1 or 2), then one token per pass.
        let unseen = fed - fed_before - (out.n_drafted.saturating_sub(1));
        let want = if drafted_before { 1..=2 } else { 4..=4 };
        assert!(
            out.n_drafted == 0 || want.contains(&unseen),
            "unseen {unseen}"
        );
        drafted_before |= out.n_drafted > 0;
        (calls_before, fed_before) = (calls, fed);
        n_out += out.tokens.len();
    }
    assert_eq!(n_out, 60);
}

#[test]
fn same_seed_same_tokens_and_different_seed_differs() {
    let prompt = [10u32, 11];
    let cfg = |seed| GenerationConfig {
        max_new_tokens: 40,
        num_speculative_tokens: 3,
        seed,
        sampling: SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        },
        ..GenerationConfig::default()
    };
    let a = run(target(1), Some(draft(1, 0.5)), &prompt, cfg(123));
    let b = run(target(1), Some(draft(1, 0.5)), &prompt, cfg(123));
    let c = run(target(1), Some(draft(1, 0.5)), &prompt, cfg(124));
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.stats.n_accepted, b.stats.n_accepted);
    assert_ne!(a.tokens, c.tokens);
    check_stats(&a);
    check_stats(&c);
}

/// Finds a prompt for which the greedy target-only output emits `stop` at generated position `pos`.
fn planted(stop: u32, k: usize) -> (Vec<u32>, usize, Vec<u32>) {
    for p0 in 0..VOCAB as u32 {
        let prompt = vec![p0, 1, 2];
        let reference = run(
            target(2).with_boost(stop, 2.5),
            None,
            &prompt,
            greedy_cfg(0, 64),
        );
        if let Some(pos) = reference.tokens.iter().position(|&t| t == stop) {
            // Inside a block: not at a position where a round with all accepted would end anyway.
            if pos > 0 && pos % (k + 1) != k {
                return (prompt, pos, reference.tokens);
            }
        }
    }
    panic!("no prompt plants the stop token");
}

#[test]
fn eos_inside_an_accepted_block_ends_generation_there() {
    let eos = 13u32;
    let k = 6;
    let (prompt, pos, reference) = planted(eos, k);
    let mut cfg = greedy_cfg(k, 64);
    cfg.eos_token_ids = vec![eos];
    // Identical draft: every draft token is accepted, so the EOS sits inside an accepted block.
    let out = run(
        target(2).with_boost(eos, 2.5),
        Some(target(2).with_boost(eos, 2.5)),
        &prompt,
        cfg.clone(),
    );
    assert_eq!(out.finish_reason, FinishReason::Eos);
    assert_eq!(out.tokens, reference[..=pos].to_vec(), "nothing after EOS");
    check_stats(&out);
    assert_eq!(
        out.stats.n_accepted, out.stats.n_drafted,
        "draft positions after EOS are not counted"
    );
    // ignore_eos goes on to max_new_tokens.
    cfg.ignore_eos = true;
    let out = run(
        target(2).with_boost(eos, 2.5),
        Some(target(2).with_boost(eos, 2.5)),
        &prompt,
        cfg,
    );
    assert_eq!(out.finish_reason, FinishReason::Length);
    assert_eq!(out.tokens, reference);
}

#[test]
fn stop_token_inside_a_block_ends_generation_there() {
    let stop = 21u32;
    let k = 5;
    let (prompt, pos, reference) = planted(stop, k);
    let mut cfg = greedy_cfg(k, 64);
    cfg.stop_token_ids = vec![stop];
    let out = run(
        target(2).with_boost(stop, 2.5),
        Some(target(2).with_boost(stop, 2.5)),
        &prompt,
        cfg,
    );
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(out.tokens, reference[..=pos].to_vec());
    check_stats(&out);
}

#[test]
fn max_new_tokens_inside_a_block_truncates_and_counts_only_emitted() {
    let prompt = [4u32, 5, 6];
    let reference = run(target(3), None, &prompt, greedy_cfg(0, 5));
    let out = run(target(3), Some(target(3)), &prompt, greedy_cfg(8, 5));
    assert_eq!(out.finish_reason, FinishReason::Length);
    assert_eq!(out.tokens, reference.tokens);
    // K is capped so no round drafts past max_new_tokens: the prefill's token (a round with nothing proposed:
    // its token counts as a bonus), then one round of K = 3 and its bonus token.
    assert_eq!(out.stats.n_rounds, 2);
    assert_eq!(out.stats.n_drafted, 3);
    assert_eq!((out.stats.n_accepted, out.stats.n_bonus), (3, 2));
    check_stats(&out);
}

#[test]
fn stop_at_truncates_output_and_statistics() {
    let mut e = Engine::new(Box::new(target(4)), Some(Box::new(target(4)))).unwrap();
    e.start(&[1, 2, 3], greedy_cfg(4, 30)).unwrap();
    let first = e.step().unwrap().clone();
    assert_eq!(first.tokens.len(), 1, "the prefill's token alone");
    let step = e.step().unwrap().clone();
    assert_eq!(step.tokens.len(), 5);
    e.stop_at(3).unwrap();
    let out = e.output().unwrap();
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(out.tokens, [&first.tokens[..], &step.tokens[..2]].concat());
    check_stats(&out);
    assert_eq!(
        (out.stats.n_drafted, out.stats.n_accepted),
        (2, 2),
        "only positions before the cut count"
    );
    assert_eq!(out.stats.accepted_at[..2], [1, 1]);
    assert_eq!(out.stats.accepted_at[2..], [0, 0]);
    assert!(matches!(e.stop_at(4), Err(SpecError::Config(_))));
}

#[test]
fn bad_requests_are_clear_errors() {
    let small = MockModel::new(32, MAX_SEQ, 0, 1.0);
    let err = Engine::new(Box::new(target(0)), Some(Box::new(small)))
        .err()
        .unwrap();
    assert!(
        matches!(&err, SpecError::Vocab(m) if m.starts_with("draft vocab size 32 != target vocab size 64")),
        "{err:?}"
    );

    let mut e = Engine::new(Box::new(target(0)), None).unwrap();
    assert!(
        matches!(e.start(&[], greedy_cfg(0, 4)), Err(SpecError::Setting { field, message }) if field == "prompt" && message.contains("empty"))
    );
    assert!(
        matches!(e.start(&[64], greedy_cfg(0, 4)), Err(SpecError::Vocab(m)) if m.contains("64"))
    );
    let long = vec![1u32; 500];
    assert!(
        matches!(e.start(&long, greedy_cfg(0, 13)), Err(SpecError::Length(m)) if m.contains("513"))
    );
    assert!(
        matches!(e.start(&[1], greedy_cfg(65, 4)), Err(SpecError::Setting { field, message }) if field == "num_speculative_tokens" && message.contains("65"))
    );
    assert!(
        matches!(e.step(), Err(SpecError::Config(_))),
        "no generation after a failed start"
    );
    let mut cfg = greedy_cfg(0, 4);
    cfg.sampling.temperature = -1.0;
    assert!(
        matches!(e.start(&[1], cfg), Err(SpecError::Setting { field, message }) if field == "temperature" && message.contains("-1"))
    );
}

/// Upper quantile of chi-square with `df` degrees of freedom at z standard deviations (Wilson-Hilferty).
fn chi2_quantile(df: f64, z: f64) -> f64 {
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Runs `n` three-token generations (seeds 0..n) and checks the joint distribution of the first three tokens
/// against the target's exact p(t1) p(t2 | t1) p(t3 | t1 t2), computed from the mock's logits, with a Pearson
/// chi-square over the cells with expected count >= 5 (df = cells - 1) at z = 4.3 (one-sided p ~ 1e-5). The first
/// token is the prefill's; the speculative round gives the second and third. Returns the generations that drafted
/// from prompt lookup.
fn check_first_three_tokens<const V: usize>(
    t: &MockModel,
    d: Option<MockModel>,
    prompt: &[u32],
    n: u64,
    cfg: &GenerationConfig,
) -> u64 {
    let (stat, crit, cells, n_ngram) = first_three_tokens_chi2::<V>(t, d, prompt, n, cfg);
    assert!(
        stat < crit,
        "chi-square {stat:.1} >= critical {crit:.1} over {cells} cells"
    );
    n_ngram
}

/// The statistic of [`check_first_three_tokens`]: `(chi-square, critical value at z = 4.3, cells, generations with
/// n-gram drafts)`.
fn first_three_tokens_chi2<const V: usize>(
    t: &MockModel,
    d: Option<MockModel>,
    prompt: &[u32],
    n: u64,
    cfg: &GenerationConfig,
) -> (f64, f64, f64, u64) {
    first_three_tokens_chi2_with::<V>(
        t,
        d.map(|d| Box::new(d) as Box<dyn Backend>),
        prompt,
        n,
        cfg,
        &[],
    )
}

/// [`first_three_tokens_chi2`] with any draft backend, the target's distribution at all three positions taken with
/// the `masked` ids removed (renormalised: what `min_tokens` >= 3 makes of it).
fn first_three_tokens_chi2_with<const V: usize>(
    t: &MockModel,
    d: Option<Box<dyn Backend>>,
    prompt: &[u32],
    n: u64,
    cfg: &GenerationConfig,
    masked: &[u32],
) -> (f64, f64, f64, u64) {
    let softmax = |seq: &[u32]| {
        let mut row = [0f32; V];
        t.row(seq, &mut row);
        for &m in masked {
            row[m as usize] = f32::NEG_INFINITY;
        }
        let m = row.iter().copied().fold(f32::MIN, f32::max);
        let e: Vec<f64> = row.iter().map(|&x| f64::from(x - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.into_iter().map(|x| x / s).collect::<Vec<f64>>()
    };
    // The first token comes from the prefill alone; the next two from the first speculative round (a K = 1 round
    // under max_new_tokens 3: an accepted or recovered token, then a bonus or the next round's).
    let p1 = softmax(prompt);
    let mut expected = vec![0f64; V * V * V];
    for a in 0..V {
        let mut seq = prompt.to_vec();
        seq.push(a as u32);
        for (b, p2) in softmax(&seq).into_iter().enumerate() {
            let mut seq3 = seq.clone();
            seq3.push(b as u32);
            for (c, p3) in softmax(&seq3).into_iter().enumerate() {
                expected[(a * V + b) * V + c] = p1[a] * p2 * p3;
            }
        }
    }
    let mut counts = vec![0u64; V * V * V];
    let mut e = Engine::new(Box::new(t.clone()), d).unwrap();
    let mut n_ngram = 0;
    // Generations that ended early (an EOS or stop id): the expected distribution has no such outcome.
    let mut ended_early = 0u64;
    for seed in 0..n {
        let cfg = GenerationConfig {
            max_new_tokens: 3,
            seed,
            ..cfg.clone()
        };
        let out = e.generate(prompt, cfg, |_| true).unwrap();
        if out.stats.n_drafted_ngram > 0 {
            n_ngram += 1;
        }
        match out.tokens[..] {
            [a, b, c] => counts[(a as usize * V + b as usize) * V + c as usize] += 1,
            _ => ended_early += 1,
        }
    }
    if ended_early > 0 {
        return (f64::INFINITY, 0.0, 0.0, n_ngram);
    }
    let (mut stat, mut cells) = (0.0, 0.0);
    for (c, p) in counts.iter().zip(&expected) {
        let ex = p * n as f64;
        if ex >= 5.0 {
            stat += (*c as f64 - ex).powi(2) / ex;
            cells += 1.0;
        }
    }
    (stat, chi2_quantile(cells - 1.0, 4.3), cells, n_ngram)
}

#[test]
fn first_three_tokens_at_temperature_one_follow_the_target_distribution() {
    // End-to-end losslessness with a draft model that disagrees often.
    let t = MockModel::new(6, 64, 11, 1.5);
    let d = MockModel::new(6, 64, 11, 1.5).with_noise(77, 1.0);
    let cfg = GenerationConfig {
        num_speculative_tokens: 3,
        sampling: SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        },
        ..GenerationConfig::default()
    };
    check_first_three_tokens::<6>(&t, Some(d), &[1, 4, 2], 40_000, &cfg);
}

fn auto_cfg(max_new: usize, per_token: f64, c_draft: f64) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: max_new,
        sampling: SamplingParams::greedy(),
        auto_k: Some(specrt_core::AutoK {
            pinned: Some(specrt_core::PinnedCosts {
                c_draft,
                c_verify: (0..9)
                    .map(|i| 10.0 * (1.0 + per_token * f64::from(i)))
                    .collect(),
            }),
            ..specrt_core::AutoK::default()
        }),
        ..GenerationConfig::default()
    }
}

#[test]
fn auto_k_keeps_greedy_parity_and_adapts_to_the_draft() {
    let prompt = [3u32, 9, 27];
    let reference = run(target(8), None, &prompt, greedy_cfg(0, 60));
    // A perfect draft with cheap verification: auto K climbs to the largest K.
    let good = run(target(8), Some(target(8)), &prompt, auto_cfg(60, 0.0, 1.0));
    assert_eq!(good.tokens, reference.tokens);
    let k_max_rounds = good.stats.rounds_by_k.get(8).copied().unwrap_or(0);
    assert!(
        k_max_rounds * 2 > good.stats.n_rounds,
        "rounds by K {:?}",
        good.stats.rounds_by_k
    );
    // A useless draft with verification that would pay above a = 0.2 (K = 1: (1 + a) / 12 > 1 / 10): drafts while
    // the acceptance estimate is high, then mostly K = 0 (plain target steps).
    let bad = run(
        target(8),
        Some(draft(8, 20.0)),
        &prompt,
        auto_cfg(60, 0.1, 1.0),
    );
    assert_eq!(bad.tokens, reference.tokens);
    let k0 = bad.stats.rounds_by_k[0];
    assert!(
        k0 * 10 > bad.stats.n_rounds * 7,
        "rounds by K {:?}",
        bad.stats.rounds_by_k
    );
    assert!(bad.stats.n_drafted > 0, "the draft is tried");
    check_stats(&bad);
    // Verification so costly that no K could pay at any acceptance near the estimate: no probe, no draft.
    let hopeless = run(
        target(8),
        Some(draft(8, 20.0)),
        &prompt,
        auto_cfg(60, 0.6, 4.0),
    );
    assert_eq!(hopeless.tokens, reference.tokens);
    assert_eq!(
        hopeless.stats.n_drafted, 0,
        "{:?}",
        hopeless.stats.rounds_by_k
    );
}

#[test]
fn auto_k_with_pinned_costs_repeats_exactly_at_temperature_one() {
    let mut cfg = auto_cfg(50, 0.1, 2.0);
    cfg.sampling = SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    };
    cfg.seed = 77;
    let a = run(target(6), Some(draft(6, 0.7)), &[1, 2], cfg.clone());
    let b = run(target(6), Some(draft(6, 0.7)), &[1, 2], cfg);
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.stats.rounds_by_k, b.stats.rounds_by_k);
}

fn ngram_cfg(k: usize, max_new: usize, use_draft_model: bool) -> GenerationConfig {
    GenerationConfig {
        ngram: Some(specrt_core::NgramConfig {
            prompt_lookup_min: 1,
            prompt_lookup_max: 4,
            method: specrt_core::LookupMethod::PromptLookup,
        }),
        use_draft_model,
        ..greedy_cfg(k, max_new)
    }
}

#[test]
fn the_draft_model_is_not_run_by_requests_that_do_not_use_it() {
    let prompt: Vec<u32> = (0..40).map(|i| [5u32, 6, 7, 1][i % 4]).collect();
    let fed = std::sync::Arc::new(std::sync::Mutex::new((0usize, 0usize)));
    let d = Box::new(Counting(draft(3, 0.5), fed.clone())) as Box<dyn Backend>;
    let mut e = Engine::new(Box::new(target(3)), Some(d)).unwrap();
    let reference = run(target(3), None, &prompt, greedy_cfg(0, 30));
    // n-gram only, and K = 0: neither prefills nor runs the draft model.
    let ngram = e
        .generate(&prompt, ngram_cfg(4, 30, false), |_| true)
        .unwrap();
    let k0 = e.generate(&prompt, greedy_cfg(0, 30), |_| true).unwrap();
    assert_eq!(fed.lock().unwrap().1, 0);
    assert_eq!(ngram.tokens, reference.tokens);
    assert_eq!(k0.tokens, reference.tokens);
    // The draft model used from the first round: prefill (prompt - 1 tokens) then drafting.
    let spec = e.generate(&prompt, greedy_cfg(4, 30), |_| true).unwrap();
    assert_eq!(spec.tokens, reference.tokens);
    assert!(fed.lock().unwrap().1 >= prompt.len() - 1);
}

#[test]
fn auto_k_declines_poor_ngram_matches_when_the_draft_model_does_better() {
    // A prompt whose n-grams recur (matches fire every round) while the target goes its own way (the n-gram
    // acceptance is poor); the draft model equals the target (acceptance 1). Verification costs grow 30% per token.
    let prompt: Vec<u32> = (0..48).map(|i| [5u32, 6, 7][i % 3]).collect();
    let pinned = specrt_core::PinnedCosts {
        c_draft: 1.0,
        c_verify: (0..9).map(|i| 10.0 * (1.0 + 0.3 * f64::from(i))).collect(),
    };
    let auto = specrt_core::AutoK {
        pinned: Some(pinned),
        probe_every: 8,
        ..specrt_core::AutoK::default()
    };
    for seed in [4u64, 5, 6] {
        let reference = run(target(seed), None, &prompt, greedy_cfg(0, 80));
        let fixed = run(
            target(seed),
            Some(draft(seed, 0.0)),
            &prompt,
            ngram_cfg(8, 80, true),
        );
        let cfg = GenerationConfig {
            auto_k: Some(auto.clone()),
            ..ngram_cfg(8, 80, true)
        };
        let adaptive = run(target(seed), Some(draft(seed, 0.0)), &prompt, cfg);
        assert_eq!(fixed.tokens, reference.tokens, "seed {seed}");
        assert_eq!(adaptive.tokens, reference.tokens, "seed {seed}");
        check_stats(&adaptive);
        let ng_rate = |o: &GenerationOutput| {
            o.stats.n_accepted_ngram as f64 / o.stats.n_drafted_ngram.max(1) as f64
        };
        eprintln!(
            "seed {seed}: fixed ngram {}/{} rounds {}, auto ngram {}/{} drafted {} rounds {}",
            fixed.stats.n_accepted_ngram,
            fixed.stats.n_drafted_ngram,
            fixed.stats.n_rounds,
            adaptive.stats.n_accepted_ngram,
            adaptive.stats.n_drafted_ngram,
            adaptive.stats.n_drafted,
            adaptive.stats.n_rounds
        );
        assert!(
            ng_rate(&fixed) < 0.5,
            "the setup needs poor n-gram acceptance"
        );
        // Fixed K takes every match; auto K declines most of them and drafts with the model instead.
        assert!(
            adaptive.stats.n_drafted_ngram * 3 < fixed.stats.n_drafted_ngram,
            "seed {seed}"
        );
        assert!(
            adaptive.stats.n_drafted > adaptive.stats.n_drafted_ngram * 2,
            "seed {seed}"
        );
        assert!(
            adaptive.stats.n_rounds < fixed.stats.n_rounds,
            "seed {seed}"
        );
    }
}

#[test]
fn ngram_drafting_keeps_greedy_parity_alone_and_combined() {
    // A repetitive prompt: proposals fire.
    let prompt: Vec<u32> = (0..48).map(|i| [5u32, 6, 7][i % 3]).collect();
    for seed in [1u64, 2, 3] {
        let reference = run(target(seed), None, &prompt, greedy_cfg(0, 50));
        let alone = run(target(seed), None, &prompt, ngram_cfg(6, 50, false));
        assert_eq!(alone.tokens, reference.tokens, "seed {seed}");
        assert!(alone.stats.n_drafted_ngram > 0);
        assert_eq!(alone.stats.n_drafted, alone.stats.n_drafted_ngram);
        check_stats(&alone);
        let both = run(
            target(seed),
            Some(draft(seed, 0.5)),
            &prompt,
            ngram_cfg(6, 50, true),
        );
        assert_eq!(both.tokens, reference.tokens, "seed {seed}");
        assert!(
            both.stats.n_drafted > both.stats.n_drafted_ngram,
            "the draft model drafts when nothing matches"
        );
        check_stats(&both);
    }
}

#[test]
fn ngram_drafts_at_temperature_one_keep_the_target_distribution() {
    // Deterministic drafts (q = point mass) from prompt lookup over a repetitive prompt.
    let t = MockModel::new(5, 64, 21, 1.2);
    let n = 30_000;
    let cfg = GenerationConfig {
        num_speculative_tokens: 3,
        sampling: SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        },
        ngram: Some(specrt_core::NgramConfig {
            prompt_lookup_min: 1,
            prompt_lookup_max: 3,
            method: specrt_core::LookupMethod::PromptLookup,
        }),
        ..GenerationConfig::default()
    };
    // Every token of the vocabulary occurs in the prompt, so whatever the prefill's token, the next round finds
    // a match (n-gram length 1 at least) and drafts from it.
    let prompt = [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0];
    let n_ngram = check_first_three_tokens::<5>(&t, None, &prompt, n, &cfg);
    assert!(
        n_ngram >= n,
        "{n_ngram} of {n} generations drafted from the prompt"
    );
}

#[test]
fn the_distribution_test_catches_a_recovered_token_drawn_from_the_draft() {
    // The same check as `first_three_tokens_at_temperature_one_follow_the_target_distribution`, on a sampler that
    // draws recovered tokens from q instead of norm(max(0, p - q)): it must fail.
    let t = MockModel::new(6, 64, 11, 1.5);
    let d = MockModel::new(6, 64, 11, 1.5).with_noise(77, 1.0);
    let cfg = GenerationConfig {
        fault: Some(specrt_core::sampling::Fault::ResidualFromDraft),
        ..t1_cfg(3)
    };
    let (stat, crit, cells, _) =
        first_three_tokens_chi2::<6>(&t, Some(d), &[1, 4, 2], 40_000, &cfg);
    assert!(
        stat > crit,
        "the broken sampler passed: chi-square {stat:.1} < critical {crit:.1} over {cells} cells"
    );
}

#[test]
fn coupled_sampling_first_three_tokens_follow_the_target_distribution() {
    // Coupled sampling keeps every position an exact sample of p, with a draft model that disagrees often.
    let t = MockModel::new(6, 64, 11, 1.5);
    let d = MockModel::new(6, 64, 11, 1.5).with_noise(77, 1.0);
    let cfg = GenerationConfig {
        coupled: true,
        ..t1_cfg(3)
    };
    check_first_three_tokens::<6>(&t, Some(d), &[1, 4, 2], 40_000, &cfg);
}

#[test]
fn coupled_speculative_output_equals_target_only_coupled_decoding() {
    // For 20 seeds and 3 prompts: K = 1, 4, 8 and auto (pinned costs), with a draft model, n-gram proposals and
    // both, at T = 1 and at T = 0.7 with top_p = 0.9 and a repetition penalty: token for token equal to target-only
    // coupled decoding with the same seed.
    let prompts: [&[u32]; 3] = [&[1, 2, 3], &[5, 9, 5, 9, 5, 9, 5], &[40, 41, 7, 7, 2]];
    let samplings = [
        SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            repetition_penalty: 1.1,
            ..SamplingParams::default()
        },
    ];
    let ngram = Some(specrt_core::NgramConfig {
        prompt_lookup_min: 1,
        prompt_lookup_max: 3,
        method: specrt_core::LookupMethod::PromptLookup,
    });
    let mut n_accepted = 0;
    for sampling in samplings {
        for prompt in prompts {
            for seed in 0..20 {
                let base = GenerationConfig {
                    max_new_tokens: 24,
                    sampling,
                    seed,
                    coupled: true,
                    ..GenerationConfig::default()
                };
                let reference = run(
                    target(3),
                    None,
                    prompt,
                    GenerationConfig {
                        num_speculative_tokens: 0,
                        ..base.clone()
                    },
                );
                let mut variants = Vec::new();
                for k in [1, 4, 8] {
                    variants.push(("draft", k, None, true));
                    variants.push(("ngram", k, ngram, false));
                    variants.push(("ngram+draft", k, ngram, true));
                }
                for (name, k, ng, use_draft) in variants {
                    let cfg = GenerationConfig {
                        num_speculative_tokens: k,
                        ngram: ng,
                        use_draft_model: use_draft,
                        ..base.clone()
                    };
                    let out = run(target(3), Some(draft(3, 0.8)), prompt, cfg);
                    assert_eq!(
                        out.tokens, reference.tokens,
                        "{name} K={k} seed={seed} prompt={prompt:?}"
                    );
                    n_accepted += out.stats.n_accepted;
                }
                let auto = GenerationConfig {
                    num_speculative_tokens: 8,
                    auto_k: auto_cfg(24, 1.0, 0.2).auto_k,
                    ..base.clone()
                };
                let out = run(target(3), Some(draft(3, 0.8)), prompt, auto);
                assert_eq!(
                    out.tokens, reference.tokens,
                    "auto K seed={seed} prompt={prompt:?}"
                );
            }
        }
    }
    assert!(
        n_accepted > 0,
        "no draft token was ever accepted: the test would not exercise acceptance"
    );
}

#[test]
fn a_pruned_vocabulary_draft_keeps_the_target_distribution_and_greedy_parity() {
    // q is zero outside the subset {0, 2, 3, 5}: tokens 1 and 4 can only come from the residual (or the bonus row).
    let subset = || specrt_core::VocabSubset::new(vec![0, 2, 3, 5], 6).unwrap();
    let t = MockModel::new(6, 64, 11, 1.5);
    let pruned = || {
        let d = MockModel::new(6, 64, 11, 1.5).with_noise(77, 0.5);
        specrt_core::SubsetBackend::new(d, subset()).unwrap()
    };
    let mut e = Engine::new(Box::new(t.clone()), Some(Box::new(pruned()))).unwrap();
    let cfg = GenerationConfig {
        max_new_tokens: 40,
        ..t1_cfg(3)
    };
    let out = e.generate(&[1, 4, 2], cfg, |_| true).unwrap();
    assert!(out.stats.n_accepted > 0);
    // Monte Carlo over the first two tokens (chi-square, as for the full draft).
    let (stat, crit, cells, _) = first_three_tokens_chi2_with::<6>(
        &t,
        Some(Box::new(pruned())),
        &[1, 4, 2],
        40_000,
        &t1_cfg(3),
        &[],
    );
    assert!(
        stat < crit,
        "chi-square {stat:.1} >= {crit:.1} over {cells} cells"
    );
    // Greedy: token for token equal to target-only.
    for k in [1, 4, 8] {
        let reference = run(target(5), None, &[3, 1, 4], greedy_cfg(0, 40));
        let sub =
            specrt_core::VocabSubset::new((0..VOCAB as u32).step_by(3).collect(), VOCAB).unwrap();
        let d = specrt_core::SubsetBackend::new(draft(5, 0.3), sub).unwrap();
        let mut e = Engine::new(Box::new(target(5)), Some(Box::new(d))).unwrap();
        let out = e.generate(&[3, 1, 4], greedy_cfg(k, 40), |_| true).unwrap();
        assert_eq!(out.tokens, reference.tokens, "K={k}");
    }
}

#[test]
fn top_logprobs_come_from_the_targets_row_of_each_position_with_or_without_speculation() {
    // Each token's alternatives are the target's own row at its position (teacher-forced here with the mock's
    // `row`), so they are the same with any draft and K, greedy or sampled, and greedy picks the first of them.
    let prompt = [3u32, 17, 42, 5];
    for (sampling, seed) in [
        (SamplingParams::greedy(), 2u64),
        (SamplingParams::default(), 5),
    ] {
        let cfg = |k: usize| GenerationConfig {
            max_new_tokens: 24,
            num_speculative_tokens: k,
            sampling,
            seed,
            top_logprobs: 5,
            ..GenerationConfig::default()
        };
        let t = target(seed);
        let mut row = vec![0.0f32; VOCAB];
        for (k, noise) in [(0usize, 0.0f32), (3, 0.3), (6, 2.0)] {
            let out = run(target(seed), Some(draft(seed, noise)), &prompt, cfg(k));
            assert_eq!(out.top_logprobs.len(), out.tokens.len(), "k {k}");
            let mut seq = prompt.to_vec();
            for (i, &tok) in out.tokens.iter().enumerate() {
                t.row(&seq, &mut row);
                let want = specrt_core::sampling::top_logprobs(&row, 5, 0).unwrap();
                let got = &out.top_logprobs[i];
                assert_eq!(got.len(), 5);
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(g.0, w.0, "k {k} position {i}");
                    assert!(
                        (g.1 - w.1).abs() < 1e-5,
                        "k {k} position {i}: {got:?} vs {want:?}"
                    );
                }
                if sampling.temperature == 0.0 {
                    assert_eq!(got[0].0, tok, "greedy picks the first alternative");
                }
                assert!(
                    (out.logprobs[i]
                        - specrt_core::sampling::log_softmax_at(&row, tok, 0).unwrap())
                    .abs()
                        < 1e-5
                );
                seq.push(tok);
            }
        }
    }
    // Out of range is a clear error; 0 (the default) returns none.
    let bad = GenerationConfig {
        top_logprobs: 21,
        ..greedy_cfg(2, 4)
    };
    assert!(
        matches!(bad.validate(), Err(SpecError::Setting { field, message }) if field == "top_logprobs" && message.contains("top_logprobs 21 is invalid"))
    );
    assert!(run(target(1), None, &prompt, greedy_cfg(0, 4))
        .top_logprobs
        .is_empty());
}

#[test]
fn prompt_logprobs_score_every_prompt_token_after_the_first_across_prefill_chunks() {
    // 300 prompt tokens: the prefill is scored in two chunks (PROMPT_LOGPROBS_CHUNK = 256).
    let prompt: Vec<u32> = (0..300u32).map(|i| (i * 7 + 3) % VOCAB as u32).collect();
    let t = target(4);
    let mut row = vec![0.0f32; VOCAB];
    for k in [0usize, 4] {
        let cfg = GenerationConfig {
            prompt_logprobs: Some(k),
            ..greedy_cfg(3, 8)
        };
        let out = run(target(4), Some(draft(4, 0.3)), &prompt, cfg);
        let p = &out.prompt;
        assert_eq!(p.logprobs.len(), prompt.len() - 1);
        assert_eq!(p.top_logprobs.len(), prompt.len() - 1);
        for j in 1..prompt.len() {
            t.row(&prompt[..j], &mut row);
            let want = specrt_core::sampling::log_softmax_at(&row, prompt[j], 0).unwrap();
            assert!((p.logprobs[j - 1] - want).abs() < 1e-5, "prompt token {j}");
            let top = specrt_core::sampling::top_logprobs(&row, k, 0).unwrap();
            assert_eq!(p.top_logprobs[j - 1], top, "prompt token {j}");
        }
        // Scoring the prompt changes nothing else.
        assert_eq!(
            out.tokens,
            run(target(4), Some(draft(4, 0.3)), &prompt, greedy_cfg(3, 8)).tokens
        );
    }
    assert!(run(target(4), None, &prompt, greedy_cfg(0, 2))
        .prompt
        .logprobs
        .is_empty());
    let bad = GenerationConfig {
        prompt_logprobs: Some(21),
        ..greedy_cfg(0, 2)
    };
    assert!(
        matches!(bad.validate(), Err(SpecError::Setting { field, message }) if field == "prompt_logprobs" && message.contains("prompt_logprobs 21 is invalid"))
    );
}

#[test]
fn min_tokens_bans_eos_and_stop_ids_before_it_in_draft_and_target_alike() {
    // EOS (id 0) is boosted so that it often comes first; min_tokens keeps it (and the stop id 5) out of the
    // first positions, with and without speculation.
    let eos = 0u32;
    let boosted = |m: MockModel| m.with_boost(eos, 3.0);
    let prompt = [3u32, 17, 42, 5];
    let cfg = |k: usize, min_tokens: u32| GenerationConfig {
        eos_token_ids: vec![eos],
        stop_token_ids: vec![5],
        sampling: SamplingParams {
            min_tokens,
            ..SamplingParams::greedy()
        },
        ..greedy_cfg(k, 30)
    };
    for seed in 0..4u64 {
        let free = run(boosted(target(seed)), None, &prompt, cfg(0, 0));
        let reference = run(boosted(target(seed)), None, &prompt, cfg(0, 12));
        assert!(
            reference.tokens[..12].iter().all(|&t| t != eos && t != 5),
            "seed {seed}: {:?}",
            reference.tokens
        );
        assert!(free.tokens.len() < 12 || reference.tokens != free.tokens);
        for k in [1usize, 4] {
            let out = run(
                boosted(target(seed)),
                Some(boosted(draft(seed, 0.3))),
                &prompt,
                cfg(k, 12),
            );
            assert_eq!(out.tokens, reference.tokens, "seed {seed} k {k}");
        }
    }
    // At temperature 1: the first three tokens follow the target's distribution without EOS and the stop id.
    let t = MockModel::new(6, 64, 11, 1.5).with_boost(eos, 1.0);
    let d = MockModel::new(6, 64, 11, 1.5).with_noise(77, 1.0);
    let t1 = GenerationConfig {
        num_speculative_tokens: 3,
        eos_token_ids: vec![eos],
        stop_token_ids: vec![5],
        sampling: SamplingParams {
            temperature: 1.0,
            min_tokens: 3,
            ..SamplingParams::default()
        },
        ..GenerationConfig::default()
    };
    let (stat, crit, cells, _) = first_three_tokens_chi2_with::<6>(
        &t,
        Some(Box::new(d.clone())),
        &[1, 4, 2],
        40_000,
        &t1,
        &[eos, 5],
    );
    assert!(
        stat < crit,
        "chi-square {stat:.1} >= {crit:.1} over {cells} cells"
    );
    // The same test sees a ban applied to one side only: here none at all (min_tokens 0) against the masked p.
    let unbanned = GenerationConfig {
        sampling: SamplingParams {
            min_tokens: 0,
            ..t1.sampling
        },
        ..t1.clone()
    };
    let (stat, crit, ..) = first_three_tokens_chi2_with::<6>(
        &t,
        Some(Box::new(d)),
        &[1, 4, 2],
        40_000,
        &unbanned,
        &[eos, 5],
    );
    assert!(
        stat >= crit,
        "the check must see the ban missing: {stat:.1} < {crit:.1}"
    );
    // min_tokens above max_new_tokens is a clear error.
    let bad = cfg(0, 31);
    assert!(
        matches!(bad.validate(), Err(SpecError::Setting { field, message }) if field == "min_tokens" && message.contains("min_tokens 31 is invalid"))
    );
}
