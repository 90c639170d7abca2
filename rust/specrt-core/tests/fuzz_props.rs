//! Fuzz-style properties of the logits processors, the verification kernel and the decode loop on arbitrary
//! floats: NaN (with payloads), +/-inf, +/-0, denormals, huge values, exact ties, and arbitrary (also invalid)
//! sampling parameters, draft rows and draft tokens.
//!
//! Each property states what must hold for every input:
//! - nothing panics;
//! - an invalid argument is the documented error: `SpecError::Config` (bad parameter, k > 64, a draft token with
//!   `q = 0`, a draft row with a negative / NaN value at a rejection), `Shape`, `Vocab`, or `NonFinite` (NaN /
//!   +inf / all -inf logits, with the row and the first bad token);
//! - otherwise every returned token is `< vocab` and has positive probability under the processed target row
//!   (a token the target cannot produce is never emitted, whatever the draft says), probabilities are finite,
//!   in [0, 1] and sum to ~1.
//!
//! Case counts: `SPECRT_FUZZ_CASES` (default 1000 per property, a few seconds in `cargo test`). The long run
//! recorded in `benches/RESULTS.md` ("Robustness") uses `SPECRT_FUZZ_CASES=20000`.

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use specrt_core::sampling::{checked_argmax, log_softmax_at};
use specrt_core::testing::MockModel;
use specrt_core::{
    verify, Backend, Engine, GenerationConfig, PenaltyContext, Rng, Sampler, SamplingParams,
    SpecError, VerifyMode, MAX_DRAFT_TOKENS,
};

fn cases() -> u32 {
    std::env::var("SPECRT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

fn config() -> Config {
    Config {
        cases: cases(),
        // No regression files in the source tree; failures print the minimal input.
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    }
}

/// A float from the awkward corners of f32, or an ordinary value. `pool` supplies repeated values (ties).
fn wild_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => -30.0f32..30.0,
        2 => prop_oneof![Just(0.0f32), Just(-0.0), Just(1.0), Just(-1.0), Just(2.5)],
        1 => Just(f32::NEG_INFINITY),
        1 => prop_oneof![Just(f32::NAN), Just(-f32::NAN), (1u32..0x3f_ffff).prop_map(|m| f32::from_bits(0x7fc0_0000 | m))],
        1 => Just(f32::INFINITY),
        1 => (1u32..0x7f_ffff).prop_map(f32::from_bits),          // positive denormals
        1 => (1u32..0x7f_ffff).prop_map(|m| -f32::from_bits(m)),  // negative denormals
        1 => prop_oneof![Just(f32::MAX), Just(f32::MIN), Just(1e38f32), Just(-1e38f32), Just(f32::MIN_POSITIVE)],
        1 => any::<f32>(),
    ]
}

/// Rows that are mostly finite (so the sampling paths, not only the error paths, are exercised): per row, either
/// arbitrary wild values, finite values with many ties, or finite values with a few -inf.
fn row(vocab: usize) -> impl Strategy<Value = Vec<f32>> {
    prop_oneof![
        3 => prop::collection::vec(wild_f32(), vocab),
        3 => prop::collection::vec(prop_oneof![Just(0.0f32), Just(1.0), Just(-1.0), Just(3.0)], vocab),
        4 => prop::collection::vec(prop_oneof![8 => -20.0f32..20.0, 1 => Just(f32::NEG_INFINITY),
            1 => (1u32..0x7f_ffff).prop_map(f32::from_bits)], vocab),
    ]
}

/// Vocabulary sizes: mostly tiny (dense corner cases), sometimes past the kernels' chunk widths (8, 16, 64) and
/// past the first top-p candidate level (1024 tokens).
fn vocab_size(min: usize) -> impl Strategy<Value = usize> {
    prop_oneof![8 => min..24, 2 => 60usize..300, 1 => 1000usize..2200]
}

/// A parameter value: in range most of the time, sometimes anything.
fn param(valid: impl Strategy<Value = f32> + 'static) -> BoxedStrategy<f32> {
    prop_oneof![4 => valid, 1 => wild_f32()].boxed()
}

/// Parameters inside the documented ranges (including their edges and denormal corners).
fn valid_params() -> impl Strategy<Value = SamplingParams> {
    (
        prop_oneof![
            Just(0.0f32),
            Just(1e-5),
            0.01f32..3.0,
            Just(1e30),
            Just(f32::MAX)
        ],
        prop_oneof![3 => Just(0u32), 3 => 1u32..8, 1 => any::<u32>()],
        prop_oneof![
            Just(1.0f32),
            1e-6f32..=1.0,
            Just(f32::MIN_POSITIVE),
            Just(1e-45)
        ],
        prop_oneof![Just(0.0f32), 0.0f32..=1.0, Just(1.0), Just(1e-45)],
        prop_oneof![Just(1.0f32), 0.1f32..3.0, Just(1e-30), Just(1e30)],
        prop_oneof![Just(0.0f32), -2.0f32..2.0, Just(-1e30), Just(1e30)],
        prop_oneof![Just(0.0f32), -2.0f32..2.0],
    )
        .prop_map(|(t, k, p, m, r, f, pr)| SamplingParams {
            temperature: t,
            top_k: k,
            top_p: p,
            min_p: m,
            repetition_penalty: r,
            frequency_penalty: f,
            presence_penalty: pr,
            min_tokens: 0,
        })
}

fn params() -> impl Strategy<Value = SamplingParams> {
    (
        param(prop_oneof![
            Just(0.0f32),
            Just(1e-5),
            0.01f32..3.0,
            Just(1e30)
        ]),
        prop_oneof![3 => Just(0u32), 3 => 1u32..8, 1 => any::<u32>()],
        param(prop_oneof![
            Just(1.0f32),
            1e-6f32..=1.0,
            Just(f32::MIN_POSITIVE)
        ]),
        param(prop_oneof![Just(0.0f32), 0.0f32..=1.0, Just(1.0)]),
        param(prop_oneof![Just(1.0f32), 0.1f32..3.0]),
        param(prop_oneof![Just(0.0f32), -2.0f32..2.0]),
        param(prop_oneof![Just(0.0f32), -2.0f32..2.0]),
    )
        .prop_map(|(t, k, p, m, r, f, pr)| SamplingParams {
            temperature: t,
            top_k: k,
            top_p: p,
            min_p: m,
            repetition_penalty: r,
            frequency_penalty: f,
            presence_penalty: pr,
            min_tokens: 0,
        })
}

/// The documented ranges, written out independently of `SamplingParams::validate`.
fn params_valid(p: &SamplingParams) -> bool {
    p.temperature.is_finite()
        && p.temperature >= 0.0
        && p.top_p > 0.0
        && p.top_p <= 1.0
        && (0.0..=1.0).contains(&p.min_p)
        && p.repetition_penalty.is_finite()
        && p.repetition_penalty > 0.0
        && p.frequency_penalty.is_finite()
        && p.presence_penalty.is_finite()
}

/// Expected check result of a raw row: the first NaN / +inf, else all -inf (an empty row counts), else fine.
fn expected_nonfinite(x: &[f32]) -> Option<(usize, &'static str)> {
    if let Some(i) = x.iter().position(|v| v.is_nan() || *v == f32::INFINITY) {
        return Some((i, if x[i].is_nan() { "NaN" } else { "+inf" }));
    }
    if x.iter().all(|v| *v == f32::NEG_INFINITY) {
        return Some((0, "all -inf"));
    }
    None
}

/// Seen tokens for the penalties (ids taken modulo vocab).
fn penalty_ctx(vocab: usize, prompt: &[u32], out: &[u32]) -> PenaltyContext {
    let mut ctx = PenaltyContext::new(vocab);
    if vocab > 0 {
        let prompt: Vec<u32> = prompt.iter().map(|t| t % vocab as u32).collect();
        ctx.add_prompt(&prompt).unwrap();
        for t in out {
            ctx.push(t % vocab as u32).unwrap();
        }
    }
    ctx
}

/// A processed row's distribution is a distribution, and sampling from it only returns kept tokens.
fn check_processed(s: &Sampler, vocab: usize, us: &[f64]) -> Result<(), TestCaseError> {
    let mut probs = vec![0f32; vocab];
    let sum = s.write_probs(&mut probs).unwrap();
    prop_assert!(
        (sum - 1.0).abs() < 1e-3,
        "probabilities sum to {sum}: {probs:?}"
    );
    prop_assert!(probs
        .iter()
        .all(|p| p.is_finite() && (0.0..=1.0).contains(p)));
    for &u in us {
        let t = s.sample_processed(u);
        prop_assert!((t as usize) < vocab, "token {t} >= vocab {vocab}");
        prop_assert!(s.prob(t) > 0.0, "sampled token {t} has probability 0");
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// `validate` accepts exactly the documented ranges; the error names the bad parameter.
    #[test]
    fn validate_accepts_exactly_the_documented_ranges(p in params()) {
        match p.validate() {
            Ok(()) => prop_assert!(params_valid(&p), "accepted {p:?}"),
            Err(SpecError::Setting { field, message: m }) => {
                prop_assert!(!params_valid(&p), "rejected valid {p:?}: {m}");
                prop_assert!(
                    ["temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty"]
                        .contains(&field.as_str()) && m.starts_with(&format!("{field} ")),
                    "the error does not name the parameter: {field}: {m}"
                );
            }
            Err(e) => prop_assert!(false, "validate returned {e:?}"),
        }
    }

    /// Processing a row: the documented NonFinite error (row, first bad token, what) for NaN / +inf / all -inf
    /// input; otherwise a proper distribution whose samples have positive probability.
    #[test]
    fn process_reports_bad_rows_and_otherwise_yields_a_distribution(
        (vocab, x) in vocab_size(0).prop_flat_map(|v| (Just(v), row(v))),
        p in valid_params(),
        penal in prop::option::of((prop::collection::vec(any::<u32>(), 0..4), prop::collection::vec(any::<u32>(), 0..6))),
        row_id in 0usize..70,
        us in prop::collection::vec(prop_oneof![Just(0.0f64), Just(1.0 - f64::EPSILON / 2.0), 0.0f64..1.0], 3),
    ) {
        let ctx = penal.as_ref().map(|(a, b)| penalty_ctx(vocab, a, b));
        let mut s = Sampler::new(vocab);
        let r = s.process(&x, row_id, &p, ctx.as_ref());
        let penalised = ctx.is_some() && p.has_penalties() && vocab > 0;
        match (r, expected_nonfinite(&x)) {
            (Ok(()), None) => check_processed(&s, vocab, &us)?,
            (Err(SpecError::NonFinite { row, token, what, .. }), Some((t, w))) => {
                prop_assert_eq!(row, row_id);
                if !penalised {
                    prop_assert_eq!((token, what.as_str()), (t, w));
                }
            }
            // Penalties may push finite logits to +/-inf (e.g. frequency_penalty -1e38): reported, not sampled.
            (Err(SpecError::NonFinite { row, token, .. }), None) if penalised => {
                prop_assert_eq!(row, row_id);
                prop_assert!(token < vocab.max(1));
            }
            (r, e) => prop_assert!(false, "process -> {r:?}, expected {e:?}"),
        }
    }

    /// `sample` / `sample_draft` / `argmax` / `log_softmax_at`: never a panic, an out-of-range token or a token of
    /// probability 0; the draft row written is the distribution the token was drawn from.
    #[test]
    fn samplers_return_in_range_tokens_or_the_documented_error(
        (vocab, x) in vocab_size(1).prop_flat_map(|v| (Just(v), row(v))),
        p in params(),
        seed in any::<u64>(),
        tok in any::<u32>(),
    ) {
        let mut s = Sampler::new(vocab);
        let bad_row = expected_nonfinite(&x);
        if p.validate().is_err() {
            return Ok(()); // validated by callers (bindings, engine); covered by the first property
        }
        let mut rng = Rng::seed_from_u64(seed);
        match s.sample(&x, &p, None, &mut rng) {
            Ok(t) => {
                prop_assert!(bad_row.is_none());
                prop_assert!((t as usize) < vocab);
                s.process(&x, 0, &p, None).unwrap();
                prop_assert!(s.prob(t) > 0.0, "sample returned token {} of probability 0", t);
            }
            Err(SpecError::NonFinite { token, .. }) => {
                prop_assert_eq!(Some(token), bad_row.map(|b| b.0));
            }
            Err(e) => prop_assert!(false, "sample -> {e:?}"),
        }
        let mut q = vec![f32::NAN; vocab];
        match s.sample_draft(&x, &p, None, &mut rng, &mut q) {
            Ok(t) => {
                prop_assert!((t as usize) < vocab);
                prop_assert!(q[t as usize] > 0.0, "draft token {} has q = {}", t, q[t as usize]);
                prop_assert!(q.iter().all(|v| v.is_finite() && *v >= 0.0));
                let sum: f64 = q.iter().map(|&v| f64::from(v)).sum();
                prop_assert!((sum - 1.0).abs() < 1e-3, "q sums to {}", sum);
            }
            Err(SpecError::NonFinite { .. }) => prop_assert!(bad_row.is_some()),
            Err(e) => prop_assert!(false, "sample_draft -> {e:?}"),
        }
        match (checked_argmax(&x, 0), bad_row) {
            (Ok(a), None) => {
                let a = a as usize;
                prop_assert!(a < vocab);
                prop_assert!(x.iter().all(|v| *v <= x[a]), "argmax {} is not a maximum", a);
                prop_assert!(x[..a].iter().all(|v| *v < x[a]), "argmax {} is not the lowest tied id", a);
            }
            (Err(SpecError::NonFinite { token, .. }), Some((t, _))) => prop_assert_eq!(token, t),
            (r, e) => prop_assert!(false, "checked_argmax -> {r:?}, expected {e:?}"),
        }
        match log_softmax_at(&x, tok % (vocab as u32 + 2), 0) {
            Ok(l) => prop_assert!(!l.is_nan() && l <= 1e-5, "log_softmax {}", l),
            Err(SpecError::Vocab(_)) => prop_assert!(tok % (vocab as u32 + 2) >= vocab as u32),
            Err(SpecError::NonFinite { .. }) => prop_assert!(bad_row.is_some()),
            Err(e) => prop_assert!(false, "log_softmax_at -> {e:?}"),
        }
    }
}

/// One arbitrary verification round: target logits, draft rows (real `sample_draft` rows or garbage), draft
/// tokens (drawn from the rows, or arbitrary ids), k possibly beyond 64 or mismatched with the arrays.
#[derive(Debug, Clone)]
struct Round {
    vocab: usize,
    k: usize,
    logits: Vec<f32>,
    draft_logits: Vec<f32>,
    garbage_q: Option<Vec<f32>>,
    garbage_tokens: Option<Vec<u32>>,
    params: SamplingParams,
    mode: VerifyMode,
    committed: Vec<u32>,
    seed: u64,
}

fn round() -> impl Strategy<Value = Round> {
    (
        0usize..12,
        prop_oneof![20 => 0usize..7, 1 => Just(MAX_DRAFT_TOKENS + 1)],
    )
        .prop_flat_map(|(vocab, k)| {
            (
                prop::collection::vec(row(vocab), k + 1).prop_map(|r| r.concat()),
                prop::collection::vec(
                    prop_oneof![4 => -10.0f32..10.0, 1 => Just(f32::NEG_INFINITY)],
                    k * vocab,
                ),
                prop::option::weighted(
                    0.3,
                    prop_oneof![
                        prop::collection::vec(wild_f32(), k * vocab),
                        prop::collection::vec(-0.5f32..1.5, k * vocab),
                        // Wrong length.
                        prop::collection::vec(0.0f32..1.0, 0..(k + 2) * vocab + 1),
                    ],
                ),
                prop::option::weighted(
                    0.2,
                    prop_oneof![
                        prop::collection::vec(0..(vocab as u32 + 1), k),
                        prop::collection::vec(any::<u32>(), 0..k + 2),
                    ],
                ),
                params(),
                prop_oneof![
                    Just(VerifyMode::Stochastic),
                    Just(VerifyMode::Deterministic),
                    Just(VerifyMode::Greedy)
                ],
                prop::collection::vec(any::<u32>(), 0..5),
                any::<u64>(),
            )
                .prop_map(
                    move |(
                        logits,
                        draft_logits,
                        garbage_q,
                        garbage_tokens,
                        params,
                        mode,
                        committed,
                        seed,
                    )| Round {
                        vocab,
                        k,
                        logits,
                        draft_logits,
                        garbage_q,
                        garbage_tokens,
                        params,
                        mode,
                        committed,
                        seed,
                    },
                )
        })
}

proptest! {
    #![proptest_config(config())]

    /// A verification round on arbitrary input: the documented error, or well-formed output whose every token has
    /// positive target probability (losslessness never breaks silently), with the penalty context restored.
    #[test]
    fn verify_returns_the_documented_error_or_a_well_formed_round(r in round()) {
        let vocab = r.vocab;
        let mut s = Sampler::new(vocab);
        let mut rng = Rng::seed_from_u64(r.seed);
        let ctx0 = penalty_ctx(vocab, &[], &r.committed);
        // Real draft rows and tokens (drawn at valid params; a row that cannot be sampled gives a garbage token).
        let dp = SamplingParams { temperature: 1.0, ..SamplingParams::default() };
        let mut q = vec![0f32; r.k * vocab];
        let mut d = Vec::new();
        if r.k <= MAX_DRAFT_TOKENS {
            for i in 0..r.k {
                let rowq = &mut q[i * vocab..(i + 1) * vocab];
                let t = s
                    .sample_draft(&r.draft_logits[i * vocab..(i + 1) * vocab], &dp, None, &mut rng, rowq)
                    .unwrap_or(0);
                d.push(t);
            }
        } else {
            d = vec![0; r.k];
        }
        let q = r.garbage_q.clone().unwrap_or(q);
        let d = r.garbage_tokens.clone().unwrap_or(d);
        let k = d.len();
        let mut ctx = ctx0.clone();
        let res = verify(&mut s, &r.logits, &q, &d, &r.params, r.mode, &mut ctx, &mut rng);
        prop_assert_eq!(ctx.len(), ctx0.len(), "verify must restore the penalty context");
        let valid = params_valid(&r.params);
        match res {
            Ok(v) => {
                prop_assert!(k <= MAX_DRAFT_TOKENS);
                prop_assert_eq!(r.logits.len(), (k + 1) * vocab);
                prop_assert!(v.n_accepted <= k);
                prop_assert_eq!(v.n_draft, k);
                prop_assert_eq!(v.tokens.len(), v.n_accepted + 1);
                prop_assert_eq!(&v.tokens[..v.n_accepted], &d[..v.n_accepted]);
                prop_assert!(v.accept_probs.iter().all(|a| (0.0..=1.0).contains(a)), "{:?}", v.accept_probs);
                prop_assert!(v.tokens.iter().all(|&t| (t as usize) < vocab));
                if valid {
                    // Every emitted token has positive probability under its processed target row.
                    let mut ctx = ctx0.clone();
                    let mut chk = Sampler::new(vocab);
                    for (i, &t) in v.tokens.iter().enumerate() {
                        let row = &r.logits[i * vocab..(i + 1) * vocab];
                        chk.process(row, i, &r.params, Some(&ctx)).unwrap();
                        prop_assert!(chk.prob(t) > 0.0, "row {} token {} has target probability 0", i, t);
                        ctx.push(t).unwrap();
                    }
                }
            }
            Err(SpecError::Config(m)) => {
                let explained = k > MAX_DRAFT_TOKENS
                    || (r.mode == VerifyMode::Greedy && !r.params.is_greedy())
                    || m.contains("draft_probs");
                prop_assert!(explained, "unexplained Config error: {}", m);
            }
            Err(SpecError::Shape(m)) => {
                let stochastic = r.mode.effective(&r.params) == VerifyMode::Stochastic;
                prop_assert!(
                    r.logits.len() != (k + 1) * vocab || (stochastic && q.len() != k * vocab),
                    "unexplained Shape error: {}", m
                );
            }
            Err(SpecError::Vocab(m)) => {
                prop_assert!(d.iter().any(|&t| t as usize >= vocab), "unexplained Vocab error: {}", m);
            }
            Err(SpecError::NonFinite { row, token, what, .. }) => {
                prop_assert!(row <= k);
                if what == "draft probability" {
                    prop_assert!(row < k && !q[row * vocab + token].is_finite());
                } else {
                    let x = &r.logits[row * vocab..(row + 1) * vocab];
                    prop_assert!(token < vocab.max(1));
                    // Raw NaN / +inf / all -inf, or penalties pushed a finite logit out of range.
                    prop_assert!(
                        expected_nonfinite(x).is_some() || r.params.has_penalties(),
                        "unexplained NonFinite at row {} token {} ({}): {:?}", row, token, what, x
                    );
                }
            }
            Err(e) => prop_assert!(false, "verify -> {e:?}"),
        }
    }
}

/// A target whose logits are arbitrary floats at chosen positions (a model emitting NaN / inf).
struct Poisoned {
    inner: MockModel,
    // (absolute position, token, value) to plant in the output rows.
    plant: Vec<(usize, usize, f32)>,
    buf: Vec<f32>,
    n_cached: usize,
}

impl Backend for Poisoned {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn max_seq_len(&self) -> usize {
        self.inner.max_seq_len()
    }
    fn forward(
        &mut self,
        tokens: &[u32],
        n_past: usize,
        n_logits: usize,
    ) -> specrt_core::Result<&[f32]> {
        let vocab = self.inner.vocab_size();
        self.buf.clear();
        self.buf
            .extend_from_slice(self.inner.forward(tokens, n_past, n_logits)?);
        self.n_cached = n_past + tokens.len();
        for &(pos, tok, v) in &self.plant {
            // Output row r holds position n_cached - n_logits + r.
            if pos + n_logits >= self.n_cached && pos < self.n_cached {
                let r = pos + n_logits - self.n_cached;
                self.buf[r * vocab + tok % vocab] = v;
            }
        }
        Ok(&self.buf)
    }
}

const VOCAB: usize = 16;

proptest! {
    #![proptest_config(Config { cases: cases() / 5 + 1, ..config() })]

    /// The decode loop with a model that emits arbitrary values at arbitrary positions, arbitrary settings and
    /// prompts: generation ends with output tokens < vocab, or a documented error (NonFinite naming the bad row,
    /// Config, Vocab, Length); after an error the engine starts a fresh generation normally.
    #[test]
    fn engine_survives_poisoned_logits_and_arbitrary_requests(
        plant in prop::collection::vec((0usize..40, 0usize..VOCAB, wild_f32()), 0..4),
        with_draft in any::<bool>(),
        prompt in prop::collection::vec(prop_oneof![10 => 0u32..VOCAB as u32, 1 => any::<u32>()], 0..6),
        max_new in prop_oneof![10 => 1usize..24, 1 => Just(0usize), 1 => Just(usize::MAX), 1 => Just(usize::MAX - 1),
            1 => (usize::MAX / 2)..usize::MAX],
        k in prop_oneof![10 => 0usize..8, 1 => Just(MAX_DRAFT_TOKENS), 1 => Just(MAX_DRAFT_TOKENS + 1), 1 => any::<usize>()],
        p in params(),
        seed in any::<u64>(),
        eos in prop::collection::vec(any::<u32>(), 0..3),
    ) {
        let target = Poisoned { inner: MockModel::new(VOCAB, 48, 1, 3.0), plant, buf: Vec::new(), n_cached: 0 };
        let draft = with_draft.then(|| Box::new(MockModel::new(VOCAB, 48, 1, 3.0).with_noise(5, 0.5)) as Box<dyn Backend>);
        let mut e = Engine::new(Box::new(target), draft).unwrap();
        let cfg = GenerationConfig {
            max_new_tokens: max_new,
            num_speculative_tokens: k,
            sampling: p,
            seed,
            eos_token_ids: eos,
            ..GenerationConfig::default()
        };
        match e.generate(&prompt, cfg, |_| true) {
            Ok(out) => {
                prop_assert!(out.tokens.iter().all(|&t| (t as usize) < VOCAB));
                prop_assert!(!out.tokens.is_empty() && out.tokens.len() <= max_new);
                prop_assert!(out.logprobs.iter().all(|l| l.is_finite() && *l <= 1e-5), "{:?}", out.logprobs);
            }
            Err(e @ (SpecError::Config(_) | SpecError::Setting { .. })) => prop_assert!(
                !params_valid(&p) || k > MAX_DRAFT_TOKENS || max_new == 0 || prompt.is_empty(),
                "unexplained Config error: {}", e
            ),
            Err(SpecError::Vocab(_)) => prop_assert!(prompt.iter().any(|&t| t as usize >= VOCAB)),
            Err(SpecError::Length(_)) => prop_assert!(prompt.len().saturating_add(max_new) > 48),
            Err(SpecError::NonFinite { row, token, .. }) => prop_assert!(row <= MAX_DRAFT_TOKENS && token < VOCAB),
            Err(e) => prop_assert!(false, "generate -> {e:?}"),
        }
        // Whatever happened, the engine is usable afterwards (the poisoned positions lie beyond this prompt).
        let ok = e.generate(&[1], GenerationConfig { max_new_tokens: 1, ..GenerationConfig::default() }, |_| true);
        prop_assert!(ok.is_ok() || matches!(ok, Err(SpecError::NonFinite { .. })), "{:?}", ok);
    }
}
