//! A draft and a target of one tokenizer whose logits widths differ in padding rows (Qwen2.5 7B: 152064 rows, 0.5B:
//! 151936, tokenizer 151665 ids): `specrt_core::vocab`.
//!
//! Models: mock models of widths 6 and 8 over a "tokenizer" of 6 ids (the mock row of a given seed is the same function
//! of the token index at any width, so the narrower model is the wider one without its last two rows, and the wider
//! target puts about 40% of its first row's mass on them). Both models are wrapped in [`Strict`], which refuses an
//! input id beyond the model's own rows, as an ONNX `Gather` over the embedding would: a target fed a draft's padding
//! id, or a draft fed a token the target emitted from its padding rows without the adapter's substitution, is an error
//! here.
//!
//! Distribution test (as `tests/engine.rs`): `DRAWS` = 40,000 two-token generations (seeds 0..DRAWS) against the
//! target's exact `p(t1) p(t2 | t1)` from the mock's logits. Tolerance: Pearson chi-square over the cells with expected
//! count >= 5 (df = cells - 1) below the chi-square quantile at z = 4.3 (one-sided ~1e-5, Wilson-Hilferty); no emitted
//! pair of target probability 0; and the first token's frequency on the target's extra rows within 4.3 binomial
//! standard deviations `sqrt(p (1 - p) / DRAWS)` of its probability `p` (0.0105 here, at p = 0.40). With fixed seeds
//! the outcome is deterministic. Broken variants run through the same function must fail it: the target cut to the
//! draft's width, a narrower target padded with 0.0 instead of -inf. A draft padded with 0.0 is not broken (q > 0 on
//! rows it lacks, but each draft token is drawn from that q): it passes, as it should.

mod common;

use common::{fit_two_tokens, greedy, run_batch, softmax, t1, Fit};

use specrt_core::testing::{MockBatchModel, MockConstraint, MockModel};
use specrt_core::{
    check_draft_width, Backend, BatchBackend, BatchEngine, BatchOptions, BatchRow, Constraint,
    Engine, GenerationConfig, GenerationOutput, Result, SpecError,
};

const TOKENIZER: usize = 6;
const NARROW: usize = 6;
const WIDE: usize = 8;
const MAX_SEQ: usize = 128;
const DRAWS: u64 = 40_000;
const Z: f64 = 4.3;
const PROMPT: [u32; 3] = [1, 4, 2];

fn model(width: usize) -> MockModel {
    MockModel::new(width, MAX_SEQ, 11, 1.5)
}

fn noisy(width: usize) -> MockModel {
    model(width).with_noise(77, 1.0)
}

/// A backend that refuses input ids beyond its rows (an embedding lookup would).
struct Strict<B>(B);

fn check_ids(ids: &[u32], width: usize) -> Result<()> {
    match ids.iter().find(|&&t| t as usize >= width) {
        Some(t) => Err(SpecError::Internal(format!(
            "id {t} fed to a model of {width} rows"
        ))),
        None => Ok(()),
    }
}

impl<B: Backend> Backend for Strict<B> {
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
    fn max_seq_len(&self) -> usize {
        self.0.max_seq_len()
    }
    fn forward(&mut self, tokens: &[u32], n_past: usize, n_logits: usize) -> Result<&[f32]> {
        check_ids(tokens, self.0.vocab_size())?;
        self.0.forward(tokens, n_past, n_logits)
    }
}

impl BatchBackend for Strict<MockBatchModel> {
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
    fn max_seq_len(&self) -> usize {
        self.0.max_seq_len()
    }
    fn max_batch(&self) -> usize {
        self.0.max_batch()
    }
    fn forward_rows(
        &mut self,
        first_slot: usize,
        rows: &[BatchRow<'_>],
        n_logits: usize,
    ) -> Result<&[f32]> {
        for r in rows {
            check_ids(r.tokens, self.0.vocab_size())?;
        }
        self.0.forward_rows(first_slot, rows, n_logits)
    }
    fn move_slot(&mut self, from: usize, to: usize, n_valid: usize) -> Result<()> {
        self.0.move_slot(from, to, n_valid)
    }
    fn kv_bytes_per_token(&self) -> usize {
        self.0.kv_bytes_per_token()
    }
    fn store_prefix(&mut self, key: u64, slot: usize, n: usize) -> Result<()> {
        self.0.store_prefix(key, slot, n)
    }
    fn load_prefix(&mut self, key: u64, slot: usize, n: usize) -> Result<()> {
        self.0.load_prefix(key, slot, n)
    }
    fn drop_prefix(&mut self, key: u64) {
        self.0.drop_prefix(key);
    }
}

/// BROKEN adapters for the tests of the test.
#[derive(Clone, Copy, Debug)]
enum Broken {
    /// The narrower model's rows padded with logit 0.0 instead of -inf (p > 0 on rows it lacks).
    PadWithZero(usize),
    /// The wider model cut to the narrower width (its mass on the extra rows lost).
    Cut(usize),
}

struct Refit<B> {
    inner: B,
    how: Broken,
    out: Vec<f32>,
}

impl<B: Backend> Refit<B> {
    fn new(inner: B, how: Broken) -> Self {
        Self {
            inner,
            how,
            out: Vec::new(),
        }
    }
}

impl<B: Backend> Backend for Refit<B> {
    fn vocab_size(&self) -> usize {
        match self.how {
            Broken::PadWithZero(w) | Broken::Cut(w) => w,
        }
    }
    fn max_seq_len(&self) -> usize {
        self.inner.max_seq_len()
    }
    fn forward(&mut self, tokens: &[u32], n_past: usize, n_logits: usize) -> Result<&[f32]> {
        let from = self.inner.vocab_size();
        let to = self.vocab_size();
        let logits = self.inner.forward(tokens, n_past, n_logits)?;
        self.out.clear();
        for row in logits.chunks_exact(from) {
            self.out.extend_from_slice(&row[..from.min(to)]);
            self.out
                .resize(self.out.len() + to.saturating_sub(from), 0.0);
        }
        Ok(&self.out)
    }
}

/// Run `DRAWS` two-token generations on `engine` and fit them to `target`'s law (`width` = the target's rows);
/// marked: the ids `>= TOKENIZER` (the wider model's extra rows).
fn fit(engine: &mut Engine, target: &MockModel, width: usize, cfg: &GenerationConfig) -> Fit {
    let law = |seq: &[u32]| {
        let mut r = vec![0f32; width];
        target.row(seq, &mut r);
        softmax(&r)
    };
    let extra = |t: u32| t as usize >= TOKENIZER;
    fit_two_tokens(engine, law, &PROMPT, cfg, DRAWS, Z, extra)
}

fn engine(target: Box<dyn Backend>, draft: Box<dyn Backend>) -> Engine {
    Engine::with_tokenizer_vocab(target, Some(draft), Some(TOKENIZER)).unwrap()
}

#[test]
fn a_draft_narrower_than_the_target_keeps_the_targets_distribution() {
    // The target puts about 40% of its first row on ids 6 and 7, which the draft lacks (q = 0): they come from
    // the residual or the bonus row, and the draft is then fed them (as its last row).
    let mut e = engine(
        Box::new(Strict(model(WIDE))),
        Box::new(Strict(noisy(NARROW))),
    );
    assert_eq!(e.vocab_size(), WIDE);
    let f = fit(&mut e, &model(WIDE), WIDE, &t1(3));
    eprintln!(
        "draft narrower: {f:?}, tolerance on the extra rows {:.4}",
        f.marked_tolerance()
    );
    assert!(f.marked_expected > 0.1, "{f:?}");
    assert!(f.passes(), "{f:?}");
}

#[test]
fn a_target_narrower_than_the_draft_keeps_the_targets_distribution() {
    // The draft's mass on ids 6 and 7 is dropped (never proposed): the target is never fed an id it lacks.
    let mut e = engine(
        Box::new(Strict(model(NARROW))),
        Box::new(Strict(noisy(WIDE).with_boost(7, 1.0))),
    );
    assert_eq!(e.vocab_size(), NARROW);
    let f = fit(&mut e, &model(NARROW), NARROW, &t1(3));
    eprintln!("target narrower: {f:?}");
    assert!(f.passes(), "{f:?}");
}

#[test]
fn coupled_sampling_keeps_the_targets_distribution_with_widths_differing() {
    let cfg = GenerationConfig {
        coupled: true,
        ..t1(3)
    };
    let mut e = engine(
        Box::new(Strict(model(WIDE))),
        Box::new(Strict(noisy(NARROW))),
    );
    let f = fit(&mut e, &model(WIDE), WIDE, &cfg);
    assert!(f.passes(), "{f:?}");
}

#[test]
fn the_test_catches_a_target_cut_to_the_drafts_width() {
    // BROKEN: a pair run at the narrower width (the target's extra rows dropped): their mass is never emitted.
    let target = Refit::new(model(WIDE), Broken::Cut(NARROW));
    let mut e = Engine::new(Box::new(target), Some(Box::new(noisy(NARROW)))).unwrap();
    let f = fit(&mut e, &model(WIDE), WIDE, &t1(3));
    eprintln!("broken (target cut): {f:?}");
    assert!(!f.passes(), "the broken pair passed: {f:?}");
    assert!(f.chi2 > f.critical && f.marked_observed == 0.0, "{f:?}");
}

#[test]
fn the_test_catches_a_narrower_target_padded_with_zero_logits() {
    // BROKEN: the narrower model padded with 0.0 instead of -inf where it is the target: p > 0 on ids it lacks.
    let target = Refit::new(model(NARROW), Broken::PadWithZero(WIDE));
    let mut e = Engine::new(Box::new(target), Some(Box::new(noisy(WIDE)))).unwrap();
    let f = fit(&mut e, &model(NARROW), NARROW, &t1(3));
    eprintln!("broken (target padded with 0.0): {f:?}");
    assert!(!f.passes(), "the broken pair passed: {f:?}");
    assert!(f.impossible > 1000, "{f:?}");
}

#[test]
fn a_narrower_draft_padded_with_zero_logits_is_still_lossless() {
    // Not a bug: padding the *draft* with 0.0 gives it q > 0 on rows it lacks, but verification needs of q only
    // that each draft token was drawn from it, so the output keeps the target's law (acceptance changes). The
    // -inf padding is what a draft that cannot score those ids means; this checks the test does not overstate.
    let draft = Refit::new(noisy(NARROW), Broken::PadWithZero(WIDE));
    let mut e = Engine::new(Box::new(Strict(model(WIDE))), Some(Box::new(draft))).unwrap();
    let f = fit(&mut e, &model(WIDE), WIDE, &t1(3));
    eprintln!("draft padded with 0.0: {f:?}");
    assert!(f.passes(), "{f:?}");
}

/// Speculative `a` emitted what target-only `b` did: the same tokens, log-probabilities and finish reason.
fn assert_same(a: &GenerationOutput, b: &GenerationOutput, what: &str) {
    assert_eq!(a.tokens, b.tokens, "{what}: tokens");
    assert_eq!(a.logprobs, b.logprobs, "{what}: logprobs");
    assert_eq!(a.top_logprobs, b.top_logprobs, "{what}: top_logprobs");
    assert_eq!(a.finish_reason, b.finish_reason, "{what}: finish reason");
}

#[test]
fn greedy_speculation_equals_target_only_with_widths_differing() {
    // Both directions; K = 1, 4, 8; ids only (forward_argmax: the wider draft's argmax often lands on its boosted
    // extra row, which the adapter rescans within the target's width), logprobs and top_logprobs, prompt logprobs.
    let prompts: [&[u32]; 3] = [&[3, 1, 4], &[0, 5], &[2, 2, 2, 1]];
    for (tw, dw) in [(WIDE, NARROW), (NARROW, WIDE)] {
        let draft = || {
            Box::new(Strict(
                MockModel::new(dw, MAX_SEQ, 11, 4.0)
                    .with_noise(5, 0.3)
                    .with_boost(dw as u32 - 1, if dw > tw { 2.0 } else { 0.0 }),
            )) as Box<dyn Backend>
        };
        let target = || Box::new(Strict(MockModel::new(tw, MAX_SEQ, 11, 4.0)));
        let mut plain = Engine::new(target(), None).unwrap();
        let mut spec = engine(target(), draft());
        for prompt in prompts {
            for extras in [(false, 0, None), (true, 0, None), (true, 3, Some(2))] {
                let with = |k| GenerationConfig {
                    logprobs: extras.0,
                    top_logprobs: extras.1,
                    prompt_logprobs: extras.2,
                    ..greedy(k, 40)
                };
                let reference = plain.generate(prompt, with(0), |_| true).unwrap();
                for k in [1, 4, 8] {
                    let out = spec.generate(prompt, with(k), |_| true).unwrap();
                    assert_eq!(out.tokens, reference.tokens, "{tw}/{dw} K={k} {extras:?}");
                    assert_eq!(out.logprobs, reference.logprobs);
                    assert_eq!(out.top_logprobs, reference.top_logprobs);
                    assert_eq!(out.prompt, reference.prompt);
                    assert!(out.stats.n_accepted > 0, "{tw}/{dw} K={k}");
                }
            }
        }
    }
}

#[test]
fn a_wide_target_emits_its_extra_rows_and_the_narrow_draft_reads_them() {
    // The target boosted on its extra row 7: greedy emits it every other step or so; the narrow draft is fed it.
    let target = || {
        Box::new(Strict(
            MockModel::new(WIDE, MAX_SEQ, 3, 2.0).with_boost(7, 1.2),
        ))
    };
    let reference = Engine::new(target(), None)
        .unwrap()
        .generate(&[1, 2], greedy(0, 30), |_| true)
        .unwrap();
    assert!(reference.tokens.contains(&7), "{:?}", reference.tokens);
    let mut spec = engine(
        target(),
        Box::new(Strict(MockModel::new(NARROW, MAX_SEQ, 3, 2.0))),
    );
    for k in [1, 3] {
        let out = spec.generate(&[1, 2], greedy(k, 30), |_| true).unwrap();
        assert_same(&out, &reference, &format!("K={k}"));
    }
}

#[test]
fn constrained_greedy_speculation_equals_target_only_with_widths_differing() {
    // The masks are the target's width; the fitted draft's rows are masked like the target's.
    let automaton = || {
        MockConstraint::new(
            WIDE,
            vec![vec![(0, 1), (7, 1), (2, 0)], vec![(3, 0), (6, 2)], vec![]],
            vec![false, true, true],
        )
    };
    let target = || Box::new(Strict(MockModel::new(WIDE, MAX_SEQ, 9, 3.0)));
    let cfg = |k| GenerationConfig {
        eos_token_ids: vec![5],
        ..greedy(k, 12)
    };
    let reference = Engine::new(target(), None)
        .unwrap()
        .generate_with(
            &[1],
            cfg(0),
            Some(Box::new(automaton()) as Box<dyn Constraint>),
            |_| true,
        )
        .unwrap();
    let mut spec = engine(target(), Box::new(Strict(noisy(NARROW))));
    for k in [1, 4] {
        let out = spec
            .generate_with(
                &[1],
                cfg(k),
                Some(Box::new(automaton()) as Box<dyn Constraint>),
                |_| true,
            )
            .unwrap();
        assert_same(&out, &reference, &format!("K={k}"));
    }
}

#[test]
fn batched_rows_equal_their_solo_runs_with_widths_differing() {
    // Greedy (ids only and with logprobs) and seeded temperature 1, both directions: each row equals the
    // single-stream engine's output on the same pair (exact on the mock models).
    for (tw, dw) in [(WIDE, NARROW), (NARROW, WIDE)] {
        let t = MockModel::new(tw, MAX_SEQ, 11, 2.0);
        let d = MockModel::new(dw, MAX_SEQ, 11, 2.0).with_noise(5, 0.7);
        let mut reqs = Vec::new();
        for (i, prompt) in [vec![3u32, 1, 4], vec![0, 5], vec![2, 2, 1, 1, 0]]
            .into_iter()
            .enumerate()
        {
            let g = greedy(3, 16);
            reqs.push((
                prompt.clone(),
                GenerationConfig {
                    logprobs: false,
                    ..g.clone()
                },
            ));
            reqs.push((prompt.clone(), g));
            reqs.push((
                prompt,
                GenerationConfig {
                    max_new_tokens: 16,
                    seed: i as u64,
                    ..t1(2 + i)
                },
            ));
        }
        let mut batch = BatchEngine::with_tokenizer_vocab(
            Box::new(Strict(MockBatchModel::new(&t, 4))),
            Some(Box::new(Strict(MockBatchModel::new(&d, 4))) as Box<dyn BatchBackend>),
            BatchOptions::default(),
            Some(TOKENIZER),
        )
        .unwrap();
        assert_eq!(batch.vocab_size(), tw);
        let outs = run_batch(&mut batch, &reqs);
        let mut solo = engine(Box::new(Strict(t.clone())), Box::new(Strict(d.clone())));
        let mut accepted = 0;
        for ((prompt, cfg), out) in reqs.iter().zip(&outs) {
            let s = solo.generate(prompt, cfg.clone(), |_| true).unwrap();
            common::assert_same_tokens(out, &s, &format!("{tw}/{dw} {prompt:?}"));
            accepted += out.stats.n_accepted;
        }
        assert!(accepted > 0);
    }
}

#[test]
fn widths_that_differ_otherwise_are_refused_naming_both_and_the_tokenizer() {
    let err = |t: usize, d: usize, n: Option<usize>| {
        Engine::with_tokenizer_vocab(
            Box::new(MockModel::new(t, MAX_SEQ, 0, 1.0)),
            Some(Box::new(MockModel::new(d, MAX_SEQ, 0, 1.0)) as Box<dyn Backend>),
            n,
        )
        .err()
    };
    assert!(err(8, 6, Some(6)).is_none() && err(6, 8, Some(6)).is_none());
    assert!(err(8, 8, None).is_none() && err(8, 8, Some(10)).is_none());
    // A draft narrower than the tokenizer lacks real tokens.
    let e = err(8, 6, Some(7)).unwrap();
    assert!(
        matches!(&e, SpecError::Vocab(m) if m.contains("draft vocab size 6 != target vocab size 8")
            && m.contains("draft's is below the tokenizer's vocabulary size 7")),
        "{e:?}"
    );
    let e = err(6, 8, Some(7)).unwrap();
    assert!(
        matches!(&e, SpecError::Vocab(m) if m.contains("target's is below")),
        "{e:?}"
    );
    // Unknown tokenizer size (Engine::new): equal widths only.
    let e = Engine::new(
        Box::new(MockModel::new(8, MAX_SEQ, 0, 1.0)),
        Some(Box::new(MockModel::new(6, MAX_SEQ, 0, 1.0)) as Box<dyn Backend>),
    )
    .err()
    .unwrap();
    assert!(
        matches!(&e, SpecError::Vocab(m) if m.contains("not known")),
        "{e:?}"
    );
    // The batched engine applies the same rule.
    let batch = |n| {
        BatchEngine::with_tokenizer_vocab(
            Box::new(MockBatchModel::new(&model(WIDE), 2)),
            Some(Box::new(MockBatchModel::new(&model(NARROW), 2)) as Box<dyn BatchBackend>),
            BatchOptions::default(),
            n,
        )
        .err()
    };
    assert!(batch(Some(TOKENIZER)).is_none());
    assert_eq!(
        batch(Some(7)),
        Some(check_draft_width(WIDE, NARROW, Some(7)).unwrap_err())
    );
    assert_eq!(
        batch(None),
        Some(check_draft_width(WIDE, NARROW, None).unwrap_err())
    );
}
