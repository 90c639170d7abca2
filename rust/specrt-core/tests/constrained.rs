//! Constrained decoding under speculation (structured output, `specrt_core::constraint`): seeded Monte Carlo of
//! whole short sequences against the exact distribution of target-only constrained decoding, greedy parity with
//! target-only constrained decoding, and the deliberately broken variants the same test must catch.
//!
//! Model: the mock target over 6 tokens (0..=4 content, 5 = EOS), a noisy mock draft, and a small automaton:
//!
//! ```text
//! state 0 (start):            0 -> 1, 1 -> 2, 2 -> 1
//! state 1:                    3 -> 3, 4 -> 5  (forces 3: the canonical spelling; 4 0 spells the same)
//! state 5:                    0 -> 3          (a forced token, the only one allowed)
//! state 2 (accepting):        0 -> 2, 4 -> 4  (EOS allowed, may go on)
//! state 3:                    1 -> 2, 4 -> 4
//! state 4 (accepting, complete)
//! ```
//!
//! Every speculative round proposes the forced tokens without a draft pass (verified as point-mass drafts), so
//! each speculative case below runs them.
//!
//! The exact distribution of a sequence is the product over its positions of the target's processed row (the mock's
//! logits for the prompt + prefix, `-inf` outside the automaton's allowed tokens and EOS where it accepts, then
//! temperature / top-p as the request says); a sequence ends at EOS, at completion (state 4) or at
//! `max_new_tokens`. The test: Pearson chi-square over the sequences with expected count >= 5 (the rest pooled into
//! one cell when that has expected count >= 5) at z = 4.3 (one-sided ~1e-5, Wilson-Hilferty quantile), and no
//! sequence of probability 0 (an invalid one) and no engine error at all.

use std::collections::HashMap;

use specrt_core::sampling::Fault;
use specrt_core::testing::MockBatchModel;
use specrt_core::testing::{chi2_quantile, MockConstraint, MockModel};
use specrt_core::{
    AutoK, Backend, BatchBackend, BatchEngine, BatchOptions, Constraint, Engine, FinishReason,
    GenerationConfig, GenerationOutput, NgramConfig, Sampler, SamplingParams, SpecError,
    SubsetBackend, VocabSubset,
};

const V: usize = 6;
const EOS: u32 = 5;
const PROMPT: [u32; 3] = [1, 4, 2];
const MAX_NEW: usize = 4;
const DRAWS: u64 = 40_000;

fn automaton() -> MockConstraint {
    MockConstraint::new(
        V,
        vec![
            vec![(0, 1), (1, 2), (2, 1)],
            vec![(3, 3), (4, 5)],
            vec![(0, 2), (4, 4)],
            vec![(1, 2), (4, 4)],
            vec![],
            vec![(0, 3)],
        ],
        vec![false, false, true, false, true, false],
    )
    .with_forced(1, vec![3])
}

fn target() -> MockModel {
    MockModel::new(V, 64, 11, 1.5)
}

fn draft() -> MockModel {
    MockModel::new(V, 64, 11, 1.5).with_noise(77, 2.0)
}

fn t1(k: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: MAX_NEW,
        num_speculative_tokens: k,
        sampling: SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        },
        eos_token_ids: vec![EOS],
        ..GenerationConfig::default()
    }
}

/// The exact distribution of target-only constrained decoding: sequence -> probability.
fn expected(
    t: &MockModel,
    prompt: &[u32],
    cfg: &GenerationConfig,
    c: &MockConstraint,
) -> HashMap<Vec<u32>, f64> {
    let mut out = HashMap::new();
    let mut sampler = Sampler::new(V);
    let mut stack = vec![(Vec::<u32>::new(), 1.0f64)];
    while let Some((seq, pr)) = stack.pop() {
        let mut state = c.fresh();
        for &tok in &seq {
            state.advance(tok).unwrap();
        }
        let mut row = [0f32; V];
        let mut ctx: Vec<u32> = prompt.to_vec();
        ctx.extend_from_slice(&seq);
        t.row(&ctx, &mut row);
        let allowed = state.allowed();
        let eos_ok = !cfg.ignore_eos && state.is_accepting().unwrap();
        for (tok, x) in row.iter_mut().enumerate() {
            #[allow(clippy::cast_possible_truncation)]
            let tok = tok as u32;
            let ok = if tok == EOS {
                eos_ok
            } else {
                allowed.contains(&tok)
            };
            if !ok {
                *x = f32::NEG_INFINITY;
            }
        }
        sampler.process(&row, 0, &cfg.sampling, None).unwrap();
        for tok in 0..V as u32 {
            let p = sampler.prob(tok);
            if p == 0.0 {
                continue;
            }
            let mut next = seq.clone();
            next.push(tok);
            let ends = tok == EOS || next.len() == cfg.max_new_tokens || {
                let mut s = state.fresh();
                next.iter().for_each(|&x| s.advance(x).unwrap());
                s.is_complete().unwrap()
            };
            if ends {
                *out.entry(next).or_insert(0.0) += pr * p;
            } else {
                stack.push((next, pr * p));
            }
        }
    }
    out
}

/// The outcome of one Monte Carlo run.
#[derive(Debug)]
struct Fit {
    stat: f64,
    crit: f64,
    cells: usize,
    /// Sequences of probability 0 that were emitted (invalid or impossible ones).
    n_impossible: u64,
    /// Generations that ended in an error.
    n_errors: u64,
    /// Draft tokens proposed / accepted over all runs (to show the rounds speculated).
    n_drafted: u64,
    n_accepted: u64,
    /// Of those, grammar-forced proposals.
    n_drafted_forced: u64,
    n_accepted_forced: u64,
}

impl Fit {
    fn passes(&self) -> bool {
        // (At least two cells, or the chi-square could not fail.)
        self.cells >= 2 && self.n_impossible == 0 && self.n_errors == 0 && self.stat < self.crit
    }
}

/// `n` seeded generations (seeds 0..n) from `prompt` under the automaton, against [`expected`].
fn fit(
    t: &MockModel,
    d: Option<Box<dyn Backend>>,
    prompt: &[u32],
    n: u64,
    cfg: &GenerationConfig,
) -> Fit {
    let c = automaton();
    let mut e = Engine::new(Box::new(t.clone()), d).unwrap();
    let outs = (0..n).map(|seed| {
        let cfg = GenerationConfig {
            seed,
            ..cfg.clone()
        };
        e.generate_with(prompt, cfg, Some(Box::new(c.fresh())), |_| true)
    });
    score(t, &c, prompt, cfg, outs)
}

/// Score seeded generations under constraint `c` against [`expected`] (a Pearson chi-square over the sequences).
fn score(
    t: &MockModel,
    c: &MockConstraint,
    prompt: &[u32],
    cfg: &GenerationConfig,
    outs: impl Iterator<Item = specrt_core::Result<GenerationOutput>>,
) -> Fit {
    let probs = expected(t, prompt, cfg, c);
    let total: f64 = probs.values().sum();
    assert!((total - 1.0).abs() < 1e-6, "reference sums to {total}");
    let mut counts: HashMap<Vec<u32>, u64> = HashMap::new();
    let (mut n_errors, mut n_drafted, mut n_accepted) = (0, 0, 0);
    let (mut n_drafted_forced, mut n_accepted_forced) = (0, 0);
    let mut n = 0u64;
    for out in outs {
        n += 1;
        match out {
            Ok(out) => {
                let reason = out.finish_reason;
                let last = out.tokens.last().copied();
                let ok_reason = match reason {
                    FinishReason::Eos => last == Some(EOS),
                    FinishReason::Grammar => c.accepts(&out.tokens),
                    FinishReason::Length => out.tokens.len() == cfg.max_new_tokens,
                    FinishReason::Stop => false,
                };
                if !ok_reason {
                    n_errors += 1;
                }
                n_drafted += out.stats.n_drafted;
                n_accepted += out.stats.n_accepted;
                n_drafted_forced += out.stats.n_drafted_forced;
                n_accepted_forced += out.stats.n_accepted_forced;
                *counts.entry(out.tokens).or_insert(0) += 1;
            }
            Err(_) => n_errors += 1,
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let nf = n as f64;
    let (mut stat, mut cells, mut n_impossible) = (0.0, 0usize, 0u64);
    let (mut pooled_o, mut pooled_e) = (0.0, 0.0);
    for (seq, &o) in &counts {
        if !probs.contains_key(seq) {
            n_impossible += o;
        }
    }
    for (seq, &p) in &probs {
        #[allow(clippy::cast_precision_loss)]
        let o = counts.get(seq).copied().unwrap_or(0) as f64;
        let ex = p * nf;
        if ex >= 5.0 {
            stat += (o - ex).powi(2) / ex;
            cells += 1;
        } else {
            pooled_o += o;
            pooled_e += ex;
        }
    }
    if pooled_e >= 5.0 {
        stat += (pooled_o - pooled_e).powi(2) / pooled_e;
        cells += 1;
    }
    #[allow(clippy::cast_precision_loss)]
    let crit = chi2_quantile((cells - 1) as f64, 4.3);
    let f = Fit {
        stat,
        crit,
        cells,
        n_impossible,
        n_errors,
        n_drafted,
        n_accepted,
        n_drafted_forced,
        n_accepted_forced,
    };
    eprintln!("{f:?}");
    f
}

fn assert_exact(f: &Fit) {
    assert!(
        f.passes(),
        "constrained speculative decoding is not target-only constrained decoding: {f:?}"
    );
}

fn boxed(m: impl Backend + 'static) -> Option<Box<dyn Backend>> {
    Some(Box::new(m))
}

#[test]
fn constrained_target_only_decoding_follows_the_reference_distribution() {
    // The reference itself: K = 0 runs the same engine without speculation.
    let f = fit(&target(), None, &PROMPT, DRAWS, &t1(0));
    assert_exact(&f);
    assert_eq!(f.n_drafted, 0);
}

#[test]
fn constrained_speculative_sequences_at_temperature_one_are_target_only_constrained_decoding() {
    let f = fit(&target(), boxed(draft()), &PROMPT, DRAWS, &t1(3));
    assert_exact(&f);
    assert!(f.n_accepted > 0 && f.n_accepted < f.n_drafted, "{f:?}");
    assert!(
        f.n_drafted_forced > 0 && f.n_accepted_forced < f.n_drafted_forced,
        "forced tokens were proposed and some rejected: {f:?}"
    );
}

#[test]
fn grammar_forced_tokens_alone_are_free_drafts_and_stay_exact() {
    // No draft model: a speculating request proposes only the forced tokens.
    let cfg = GenerationConfig {
        use_draft_model: false,
        ..t1(3)
    };
    let f = fit(&target(), None, &PROMPT, DRAWS, &cfg);
    assert_exact(&f);
    assert!(
        f.n_drafted > 0 && f.n_drafted == f.n_drafted_forced,
        "{f:?}"
    );
}

#[test]
fn the_sequence_test_catches_forced_tokens_accepted_without_verification() {
    let cfg = GenerationConfig {
        fault: Some(Fault::ForcedUnverified),
        ..t1(3)
    };
    let f = fit(&target(), boxed(draft()), &PROMPT, DRAWS, &cfg);
    assert!(!f.passes(), "the broken variant passed: {f:?}");
}

#[test]
fn constrained_speculative_sequences_with_top_p_are_target_only_constrained_decoding() {
    let mut cfg = t1(3);
    cfg.sampling.top_p = 0.8;
    cfg.sampling.temperature = 1.3;
    let f = fit(&target(), boxed(draft()), &PROMPT, DRAWS, &cfg);
    assert_exact(&f);
}

#[test]
fn constrained_speculative_sequences_under_ignore_eos_never_end_by_eos() {
    // EOS is masked out under ignore_eos; the request still ends at completion.
    let mut cfg = t1(2);
    cfg.ignore_eos = true;
    let f = fit(&target(), boxed(draft()), &PROMPT, DRAWS, &cfg);
    assert_exact(&f);
}

#[test]
fn constrained_prompt_lookup_proposals_are_cut_at_the_first_refused_token_and_stay_exact() {
    // A prompt that repeats the automaton's own path, so n-gram proposals are often partly allowed.
    let prompt = [0, 3, 1, 0, 0, 3, 1, 0];
    let cfg = GenerationConfig {
        ngram: Some(NgramConfig {
            prompt_lookup_min: 1,
            prompt_lookup_max: 3,
            method: specrt_core::LookupMethod::PromptLookup,
        }),
        ..t1(3)
    };
    let f = fit(&target(), None, &prompt, DRAWS, &cfg);
    assert_exact(&f);
    assert!(f.n_drafted > 0, "the prompt lookup proposed nothing: {f:?}");
}

#[test]
fn constrained_coupled_sampling_keeps_the_target_only_distribution() {
    let cfg = GenerationConfig {
        coupled: true,
        ..t1(3)
    };
    let f = fit(&target(), boxed(draft()), &PROMPT, DRAWS, &cfg);
    assert_exact(&f);
}

fn pruned_draft() -> SubsetBackend<MockModel> {
    // No token 3 (the automaton's only choice in state 1) nor 4: the masked q is all zero there.
    SubsetBackend::new(draft(), VocabSubset::new(vec![0, 1, 2, 5], V).unwrap()).unwrap()
}

#[test]
fn a_pruned_draft_without_mass_on_the_allowed_tokens_stops_drafting_and_stays_exact() {
    let f = fit(&target(), boxed(pruned_draft()), &PROMPT, DRAWS, &t1(3));
    assert_exact(&f);
    assert!(f.n_drafted > 0);
}

#[test]
fn the_sequence_test_catches_the_mask_applied_to_the_target_only() {
    let cfg = GenerationConfig {
        fault: Some(Fault::MaskTargetOnly),
        ..t1(3)
    };
    let f = fit(&target(), boxed(draft()), &PROMPT, DRAWS, &cfg);
    assert!(!f.passes(), "the broken variant passed: {f:?}");
}

#[test]
fn the_sequence_test_catches_a_constraint_not_rolled_back_after_a_rejection() {
    let cfg = GenerationConfig {
        fault: Some(Fault::NoConstraintRollback),
        ..t1(3)
    };
    let f = fit(&target(), boxed(draft()), &PROMPT, DRAWS, &cfg);
    assert!(!f.passes(), "the broken variant passed: {f:?}");
}

// ---- greedy parity on a larger vocabulary ----

const VOCAB: usize = 64;
const EOS64: u32 = 63;

/// A pseudo-random automaton over 0..63 (EOS 63 excluded): 12 states, each allowing 1..=12 tokens (states 1, 6:
/// one token, forced).
fn automaton64(seed: u64) -> MockConstraint {
    let mut h = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next_u = || {
        h ^= h << 13;
        h ^= h >> 7;
        h ^= h << 17;
        h
    };
    let n_states = 12;
    let mut next = Vec::new();
    let mut accepting = Vec::new();
    for s in 0..n_states {
        #[allow(clippy::cast_possible_truncation)]
        let n = if s % 5 == 1 {
            // A forced token.
            1
        } else {
            1 + (next_u() % 12) as usize
        };
        let mut row: Vec<(u32, usize)> = Vec::new();
        for _ in 0..n {
            #[allow(clippy::cast_possible_truncation)]
            let t = (next_u() % 63) as u32;
            #[allow(clippy::cast_possible_truncation)]
            let to = (next_u() % n_states as u64) as usize;
            if !row.iter().any(|e| e.0 == t) {
                row.push((t, to));
            }
        }
        next.push(row);
        accepting.push(s % 4 == 3);
    }
    MockConstraint::new(VOCAB, next, accepting)
}

/// A named setting: draft backend and request.
type Variant = (String, Option<Box<dyn Backend>>, GenerationConfig);

#[test]
fn greedy_constrained_speculative_output_equals_greedy_constrained_target_only_output() {
    let ngram = Some(NgramConfig {
        prompt_lookup_min: 1,
        prompt_lookup_max: 3,
        method: specrt_core::LookupMethod::PromptLookup,
    });
    let mut n = (0, 0);
    for seed in 0..6u64 {
        let c = automaton64(seed);
        let t = MockModel::new(VOCAB, 512, seed, 4.0);
        let d = MockModel::new(VOCAB, 512, seed, 4.0).with_noise(seed + 1000, 0.4);
        let cfg = |k: usize| GenerationConfig {
            max_new_tokens: 40,
            num_speculative_tokens: k,
            sampling: SamplingParams::greedy(),
            eos_token_ids: vec![EOS64],
            logprobs: false,
            ..GenerationConfig::default()
        };
        let prompt = [3, 1, 4, 1, 5];
        let mut e = Engine::new(Box::new(t.clone()), None).unwrap();
        let reference = e
            .generate_with(&prompt, cfg(0), Some(Box::new(c.fresh())), |_| true)
            .unwrap();
        let body: Vec<u32> = reference
            .tokens
            .iter()
            .copied()
            .filter(|&x| x != EOS64)
            .collect();
        assert!(
            reference.finish_reason == FinishReason::Length || c.accepts(&body),
            "seed {seed}: {reference:?}"
        );
        let sub = VocabSubset::new((0..VOCAB as u32).step_by(3).collect(), VOCAB).unwrap();
        let variants: Vec<Variant> = vec![
            ("k1".into(), boxed(d.clone()), cfg(1)),
            ("k4".into(), boxed(d.clone()), cfg(4)),
            ("k8".into(), boxed(d.clone()), cfg(8)),
            ("ngram".into(), None, GenerationConfig { ngram, ..cfg(4) }),
            (
                "ngram+draft".into(),
                boxed(d.clone()),
                GenerationConfig { ngram, ..cfg(4) },
            ),
            (
                "pruned".into(),
                boxed(SubsetBackend::new(d.clone(), sub).unwrap()),
                cfg(4),
            ),
            (
                "forced only".into(),
                None,
                GenerationConfig {
                    use_draft_model: false,
                    ..cfg(4)
                },
            ),
            (
                "auto K".into(),
                boxed(d.clone()),
                GenerationConfig {
                    auto_k: Some(AutoK::default()),
                    ..cfg(4)
                },
            ),
            (
                "logprobs".into(),
                boxed(d.clone()),
                GenerationConfig {
                    logprobs: true,
                    ..cfg(4)
                },
            ),
        ];
        for (name, dm, cfg) in variants {
            let mut e = Engine::new(Box::new(t.clone()), dm).unwrap();
            let out = e
                .generate_with(&prompt, cfg, Some(Box::new(c.fresh())), |_| true)
                .unwrap();
            same_greedy(&out, &reference, &format!("seed {seed} {name}"), &mut n);
        }
    }
    assert_speculated(n);
}

/// Assert greedy `out` equals `reference` (tokens, finish reason); count its accepted and forced drafts into `n`.
fn same_greedy(
    out: &GenerationOutput,
    reference: &GenerationOutput,
    what: &str,
    n: &mut (u64, u64),
) {
    assert_eq!(out.tokens, reference.tokens, "{what}");
    assert_eq!(out.finish_reason, reference.finish_reason, "{what}");
    n.0 += out.stats.n_accepted;
    n.1 += out.stats.n_drafted_forced;
}

/// The parity runs speculated: some draft accepted, some forced token proposed.
fn assert_speculated(n: (u64, u64)) {
    assert!(n.0 > 0, "no draft token was accepted: nothing was tested");
    assert!(n.1 > 0, "no forced token was proposed");
}

#[test]
fn a_constraint_that_is_complete_from_the_start_generates_nothing() {
    let c = MockConstraint::new(V, vec![vec![]], vec![true]);
    let mut e = Engine::new(Box::new(target()), boxed(draft())).unwrap();
    let out = e
        .generate_with(&PROMPT, t1(3), Some(Box::new(c)), |_| true)
        .unwrap();
    assert!(out.tokens.is_empty());
    assert_eq!(out.finish_reason, FinishReason::Grammar);
    let mut used = automaton();
    used.advance(0).unwrap();
    let err = e
        .start_with(&PROMPT, t1(3), Some(Box::new(used)))
        .unwrap_err();
    assert!(err.to_string().contains("consumed 1 tokens"), "{err}");
}

// ---- batched rounds (`BatchEngine::add_with`) ----

/// A second automaton over the same tokens: 0* then either 1 (which forces 2, a chain) or 3, then 0* and an
/// optional 4 that completes it.
fn automaton_b() -> MockConstraint {
    MockConstraint::new(
        V,
        vec![
            vec![(0, 0), (1, 1), (3, 2)],
            vec![(2, 2)],
            vec![(0, 2), (4, 3)],
            vec![],
        ],
        vec![false, false, true, true],
    )
}

fn batch_engine(t: &MockModel, d: Option<&MockModel>, max_batch: usize) -> BatchEngine {
    BatchEngine::new(
        Box::new(MockBatchModel::new(t, max_batch)),
        d.map(|d| Box::new(MockBatchModel::new(d, max_batch)) as Box<dyn BatchBackend>),
        BatchOptions::default(),
    )
    .unwrap()
}

/// Run every `(id, prompt, cfg, constraint)` through `e` to the end; returns each id's output or the error its row
/// ended with.
fn run_batch(
    e: &mut BatchEngine,
    reqs: Vec<(u64, Vec<u32>, GenerationConfig, Option<MockConstraint>)>,
) -> HashMap<u64, specrt_core::Result<GenerationOutput>> {
    let ids: Vec<u64> = reqs.iter().map(|r| r.0).collect();
    for (id, prompt, cfg, c) in reqs {
        let c = c.map(|c| Box::new(c) as Box<dyn Constraint>);
        e.add_with(id, &prompt, cfg, c).unwrap();
    }
    let mut errors = HashMap::new();
    let mut guard = 0;
    while !e.is_idle() {
        for s in e.step().unwrap() {
            if let Some(err) = &s.error {
                errors.insert(s.id, err.clone());
            }
        }
        guard += 1;
        assert!(guard < 1_000_000, "the batch never drained");
    }
    ids.into_iter()
        .map(|id| {
            let out = match errors.remove(&id) {
                Some(err) => Err(err),
                None => e
                    .take_output(id)
                    .ok_or_else(|| SpecError::Internal(format!("request {id} has no output"))),
            };
            (id, out)
        })
        .collect()
}

/// `n` seeds of three requests each, all queued on one batch engine of 3 rows (rows of different seeds share
/// rounds as they join and leave): one under [`automaton`] (`cfg_a`), one under [`automaton_b`] and one
/// unconstrained (`cfg`). Returns the fits of the two constrained ones against their target-only laws.
fn fit_batched(
    t: &MockModel,
    d: Option<&MockModel>,
    prompt: &[u32],
    n: u64,
    cfg: &GenerationConfig,
    cfg_a: &GenerationConfig,
) -> (Fit, Fit) {
    let (a, b) = (automaton(), automaton_b());
    let mut reqs = Vec::new();
    for seed in 0..n {
        let c = |cfg: &GenerationConfig| GenerationConfig {
            seed,
            ..cfg.clone()
        };
        reqs.push((3 * seed, prompt.to_vec(), c(cfg_a), Some(a.fresh())));
        reqs.push((3 * seed + 1, prompt.to_vec(), c(cfg), Some(b.fresh())));
        reqs.push((3 * seed + 2, prompt.to_vec(), c(cfg), None));
    }
    let mut e = batch_engine(t, d, 3);
    let mut outs = run_batch(&mut e, reqs);
    let mut take =
        |j: u64| -> Vec<_> { (0..n).map(|s| outs.remove(&(3 * s + j)).unwrap()).collect() };
    let fa = score(t, &a, prompt, cfg_a, take(0).into_iter());
    let fb = score(t, &b, prompt, cfg, take(1).into_iter());
    (fa, fb)
}

const BATCH_DRAWS: u64 = 10_000;

#[test]
fn batched_constrained_rows_at_temperature_one_are_target_only_constrained_decoding() {
    let cfg = t1(3);
    let (fa, fb) = fit_batched(&target(), Some(&draft()), &PROMPT, BATCH_DRAWS, &cfg, &cfg);
    assert_exact(&fa);
    assert_exact(&fb);
    for f in [&fa, &fb] {
        assert!(f.n_accepted > 0 && f.n_accepted < f.n_drafted, "{f:?}");
        assert!(f.n_drafted_forced > 0, "{f:?}");
    }
    // (Automaton B's forced token is the target's only choice there: always accepted.)
    assert!(fa.n_accepted_forced < fa.n_drafted_forced, "{fa:?}");
}

#[test]
fn batched_constrained_rows_with_top_p_and_forced_tokens_only_stay_exact() {
    let mut cfg = t1(3);
    cfg.sampling.top_p = 0.8;
    cfg.sampling.temperature = 1.3;
    let (fa, fb) = fit_batched(&target(), Some(&draft()), &PROMPT, BATCH_DRAWS, &cfg, &cfg);
    assert_exact(&fa);
    assert_exact(&fb);
    // No draft model: the constrained rows propose their forced tokens only.
    let cfg = t1(3);
    let (fa, fb) = fit_batched(&target(), None, &PROMPT, BATCH_DRAWS, &cfg, &cfg);
    assert_exact(&fa);
    assert_exact(&fb);
    assert!(
        fa.n_drafted > 0 && fa.n_drafted == fa.n_drafted_forced,
        "{fa:?}"
    );
}

#[test]
fn batched_constrained_prompt_lookup_proposals_stay_exact() {
    let prompt = [0, 3, 1, 0, 0, 3, 1, 0];
    let cfg = GenerationConfig {
        ngram: Some(NgramConfig {
            prompt_lookup_min: 1,
            prompt_lookup_max: 3,
            method: specrt_core::LookupMethod::PromptLookup,
        }),
        ..t1(3)
    };
    let (fa, fb) = fit_batched(&target(), Some(&draft()), &prompt, BATCH_DRAWS, &cfg, &cfg);
    assert_exact(&fa);
    assert_exact(&fb);
    assert!(fa.n_drafted > fa.n_drafted_forced, "{fa:?}");
}

#[test]
fn the_batched_sequence_test_catches_each_broken_variant_in_its_row_only() {
    // (Each is far off at a quarter of the draws: chi-square in the thousands against a critical value near 60.)
    for fault in [
        Fault::MaskTargetOnly,
        Fault::NoConstraintRollback,
        Fault::ForcedUnverified,
    ] {
        let cfg = t1(3);
        let broken = GenerationConfig {
            fault: Some(fault),
            ..t1(3)
        };
        let (fa, fb) = fit_batched(
            &target(),
            Some(&draft()),
            &PROMPT,
            BATCH_DRAWS / 4,
            &cfg,
            &broken,
        );
        assert!(!fa.passes(), "{fault:?}: the broken variant passed: {fa:?}");
        assert_exact(&fb);
    }
}

#[test]
fn greedy_batched_constrained_rows_equal_greedy_single_stream_constrained_output() {
    let ngram = Some(NgramConfig {
        prompt_lookup_min: 1,
        prompt_lookup_max: 3,
        method: specrt_core::LookupMethod::PromptLookup,
    });
    let mut n = (0, 0);
    for seed in 0..6u64 {
        let t = MockModel::new(VOCAB, 512, seed, 4.0);
        let d = MockModel::new(VOCAB, 512, seed, 4.0).with_noise(seed + 1000, 0.4);
        let cfg = |k: usize| GenerationConfig {
            max_new_tokens: 40,
            num_speculative_tokens: k,
            sampling: SamplingParams::greedy(),
            eos_token_ids: vec![EOS64],
            logprobs: false,
            ..GenerationConfig::default()
        };
        let prompt = vec![3, 1, 4, 1, 5];
        let (c1, c2) = (automaton64(seed), automaton64(seed + 100));
        let reqs: Vec<(u64, Vec<u32>, GenerationConfig, Option<MockConstraint>)> = vec![
            (0, prompt.clone(), cfg(4), Some(c1.fresh())),
            (1, prompt.clone(), cfg(2), Some(c2.fresh())),
            (
                2,
                prompt.clone(),
                GenerationConfig { ngram, ..cfg(4) },
                Some(c1.fresh()),
            ),
            (
                3,
                prompt.clone(),
                GenerationConfig {
                    use_draft_model: false,
                    ..cfg(4)
                },
                Some(c2.fresh()),
            ),
            (
                4,
                prompt.clone(),
                GenerationConfig {
                    logprobs: true,
                    ..cfg(8)
                },
                Some(c1.fresh()),
            ),
            (5, prompt.clone(), cfg(4), None),
            (
                6,
                prompt.clone(),
                GenerationConfig {
                    auto_k: Some(AutoK::default()),
                    ..cfg(4)
                },
                Some(c2.fresh()),
            ),
        ];
        let mut e = batch_engine(&t, Some(&d), 4);
        let mut outs = run_batch(&mut e, reqs.clone());
        for (id, p, cfg, c) in reqs {
            let mut solo = Engine::new(Box::new(t.clone()), None).unwrap();
            let c = c.map(|c| Box::new(c) as Box<dyn Constraint>);
            let reference = solo
                .generate_with(
                    &p,
                    GenerationConfig {
                        num_speculative_tokens: 0,
                        ..cfg
                    },
                    c,
                    |_| true,
                )
                .unwrap();
            let out = outs.remove(&id).unwrap().unwrap();
            same_greedy(&out, &reference, &format!("seed {seed} row {id}"), &mut n);
        }
    }
    assert_speculated(n);
}

/// A constraint whose matcher fails once it has consumed `after` tokens.
struct Failing {
    inner: MockConstraint,
    after: usize,
}

impl Constraint for Failing {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn fill_mask(&mut self, mask: &mut [u32]) -> specrt_core::Result<()> {
        if self.inner.len() >= self.after {
            return Err(SpecError::Config("matcher failed (test)".to_owned()));
        }
        self.inner.fill_mask(mask)
    }
    fn advance(&mut self, token: u32) -> specrt_core::Result<()> {
        self.inner.advance(token)
    }
    fn truncate(&mut self, len: usize) -> specrt_core::Result<()> {
        self.inner.truncate(len)
    }
    fn is_accepting(&mut self) -> specrt_core::Result<bool> {
        self.inner.is_accepting()
    }
    fn is_complete(&mut self) -> specrt_core::Result<bool> {
        self.inner.is_complete()
    }
}

#[test]
fn a_batched_row_whose_matcher_fails_ends_alone() {
    let t = MockModel::new(VOCAB, 512, 3, 4.0);
    let d = MockModel::new(VOCAB, 512, 3, 4.0).with_noise(1003, 0.4);
    // A chain automaton that never completes early: 10 states cycling through tokens 0..9.
    let c = MockConstraint::new(
        VOCAB,
        (0..10u32)
            .map(|s| {
                vec![
                    (s, ((s + 1) % 10) as usize),
                    (s + 10, ((s + 1) % 10) as usize),
                ]
            })
            .collect(),
        vec![false; 10],
    );
    let cfg = GenerationConfig {
        max_new_tokens: 30,
        num_speculative_tokens: 3,
        sampling: SamplingParams::greedy(),
        eos_token_ids: vec![EOS64],
        ..GenerationConfig::default()
    };
    let prompt = [3, 1, 4];
    let mut e = batch_engine(&t, Some(&d), 3);
    e.add_with(
        0,
        &prompt,
        cfg.clone(),
        Some(Box::new(Failing {
            inner: c.fresh(),
            after: 5,
        })),
    )
    .unwrap();
    e.add_with(1, &prompt, cfg.clone(), Some(Box::new(c.fresh())))
        .unwrap();
    e.add(2, &prompt, cfg.clone()).unwrap();
    let mut failed = Vec::new();
    let mut streamed: Vec<Vec<u32>> = vec![Vec::new(); 3];
    while !e.is_idle() {
        for s in e.step().unwrap() {
            streamed[s.id as usize].extend_from_slice(&s.out.tokens);
            if let Some(err) = &s.error {
                failed.push((s.id, err.to_string()));
            }
        }
    }
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, 0);
    assert!(failed[0].1.contains("matcher failed"), "{failed:?}");
    // (It fails once proposals advance it to 5 tokens: after 1 to 5 committed ones.)
    assert!(
        !streamed[0].is_empty() && streamed[0].len() <= 5,
        "{:?}",
        streamed[0]
    );
    assert!(e.take_output(0).is_none());
    for (id, c) in [(1u64, Some(c.fresh())), (2, None)] {
        let mut solo = Engine::new(Box::new(t.clone()), None).unwrap();
        let c = c.map(|c| Box::new(c) as Box<dyn Constraint>);
        let reference = solo
            .generate_with(
                &prompt,
                GenerationConfig {
                    num_speculative_tokens: 0,
                    ..cfg.clone()
                },
                c,
                |_| true,
            )
            .unwrap();
        let out = e.take_output(id).unwrap();
        assert_eq!(out.tokens, reference.tokens, "row {id}");
    }
    // Alone in the batch (every row fails while proposing): its error is still reported and the engine drains.
    let lone = Failing {
        inner: c.fresh(),
        after: 0,
    };
    e.add_with(3, &prompt, cfg, Some(Box::new(lone))).unwrap();
    let mut errors = Vec::new();
    for _ in 0..10 {
        errors.extend(e.step().unwrap().iter().filter_map(|s| s.error.clone()));
    }
    assert!(e.is_idle());
    assert_eq!(errors.len(), 1, "{errors:?}");
}
