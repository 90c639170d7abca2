//! Helpers shared by the integration tests.

use specrt_core::{BatchEngine, Engine, GenerationConfig, GenerationOutput, SamplingParams};

/// `a` and `b` emitted the same tokens with the same sources, log-probabilities, alternatives, prompt scores and
/// finish reason (statistics are each test's to compare).
#[allow(dead_code)] // not every test crate that shares these helpers compares outputs this way
pub fn assert_same_tokens(a: &GenerationOutput, b: &GenerationOutput, what: &str) {
    assert_eq!(a.tokens, b.tokens, "{what}: tokens");
    assert_eq!(a.sources, b.sources, "{what}: sources");
    assert_eq!(a.logprobs, b.logprobs, "{what}: logprobs");
    assert_eq!(a.top_logprobs, b.top_logprobs, "{what}: top_logprobs");
    assert_eq!(a.prompt, b.prompt, "{what}: prompt scores");
    assert_eq!(a.finish_reason, b.finish_reason, "{what}: finish reason");
}

/// Every request through the batched engine (all added at once, ids 0..), each step's rows error-free; each output in
/// order.
#[allow(dead_code)] // not every test crate that shares these helpers runs batches
pub fn run_batch(
    e: &mut BatchEngine,
    reqs: &[(Vec<u32>, GenerationConfig)],
) -> Vec<GenerationOutput> {
    for (i, (p, c)) in reqs.iter().enumerate() {
        e.add(i as u64, p, c.clone()).unwrap();
    }
    let mut guard = 0;
    while !e.is_idle() {
        for s in e.step().unwrap() {
            assert!(s.error.is_none(), "{:?}", s.error);
        }
        guard += 1;
        assert!(guard < 10_000, "the batch never drained");
    }
    (0..reqs.len())
        .map(|i| e.take_output(i as u64).expect("finished"))
        .collect()
}

/// Greedy decoding of up to `max_new` tokens with K = `k`.
#[allow(dead_code)] // not every test crate that shares these helpers decodes greedily
pub fn greedy(k: usize, max_new: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: max_new,
        num_speculative_tokens: k,
        sampling: SamplingParams::greedy(),
        ..GenerationConfig::default()
    }
}

/// Sampling at T = 1 with K = `k` (other settings default).
#[allow(dead_code)] // not every test crate that shares these helpers samples
pub fn t1(k: usize) -> GenerationConfig {
    GenerationConfig {
        num_speculative_tokens: k,
        sampling: SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        },
        ..GenerationConfig::default()
    }
}

/// The softmax of a logits row, in f64.
#[allow(dead_code)]
pub fn softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().copied().fold(f32::MIN, f32::max);
    let e: Vec<f64> = row.iter().map(|&x| f64::from(x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// The fit of the first two tokens of `draws` seeded generations to a target's law
/// ([`fit_two_tokens`]).
#[derive(Debug)]
#[allow(dead_code)]
pub struct Fit {
    /// Pearson's chi-square over the cells with expected count at least 5.
    pub chi2: f64,
    /// The chi-square quantile at `z` for `cells - 1` degrees of freedom (Wilson-Hilferty).
    pub critical: f64,
    /// Cells counted.
    pub cells: usize,
    /// Emitted pairs whose target probability is 0 (ids beyond the target's rows included).
    pub impossible: u64,
    /// Observed and expected frequency of first tokens among the marked ids.
    pub marked_observed: f64,
    pub marked_expected: f64,
    draws: u64,
    z: f64,
}

#[allow(dead_code)]
impl Fit {
    /// `z` binomial standard deviations `sqrt(p (1 - p) / draws)` of the marked ids' frequency `p`.
    pub fn marked_tolerance(&self) -> f64 {
        self.z * (self.marked_expected * (1.0 - self.marked_expected) / self.draws as f64).sqrt()
    }

    /// Chi-square below its critical value, nothing impossible, the marked frequency within its tolerance.
    pub fn passes(&self) -> bool {
        assert!(self.cells >= 10, "too few cells to test: {self:?}");
        self.chi2 < self.critical
            && self.impossible == 0
            && (self.marked_observed - self.marked_expected).abs() <= self.marked_tolerance()
    }
}

/// Run `draws` two-token generations of `prompt` (seeds `0..draws`) on `engine` and fit them to the target law
/// `law` (the next-token distribution after a sequence, `[width]`: ids `>= width` have probability 0): Pearson chi-square over the cells with expected
/// count at least 5 against the quantile at `z`, the emitted pairs of probability 0, and the frequency of first
/// tokens for which `marked` holds against its probability.
#[allow(dead_code)]
pub fn fit_two_tokens(
    engine: &mut Engine,
    law: impl Fn(&[u32]) -> Vec<f64>,
    prompt: &[u32],
    cfg: &GenerationConfig,
    draws: u64,
    z: f64,
    marked: impl Fn(u32) -> bool,
) -> Fit {
    let p1 = law(prompt);
    let width = p1.len();
    let mut expected = vec![0f64; width * width];
    for a in 0..width {
        let mut seq = prompt.to_vec();
        seq.push(a as u32);
        for (b, p2) in law(&seq).into_iter().enumerate() {
            expected[a * width + b] = p1[a] * p2;
        }
    }
    let mut counts = std::collections::HashMap::<(u32, u32), u64>::new();
    for seed in 0..draws {
        let cfg = GenerationConfig {
            max_new_tokens: 2,
            seed,
            ..cfg.clone()
        };
        let out = engine.generate(prompt, cfg, |_| true).unwrap();
        let [a, b] = out.tokens[..] else {
            panic!("{:?}", out.tokens)
        };
        *counts.entry((a, b)).or_default() += 1;
    }
    let n = draws as f64;
    let (mut chi2, mut cells, mut impossible, mut hits) = (0.0, 0usize, 0u64, 0u64);
    for (&(a, b), &c) in &counts {
        let (ia, ib) = (a as usize, b as usize);
        if ia >= width || ib >= width || expected[ia * width + ib] == 0.0 {
            impossible += c;
        }
        if marked(a) {
            hits += c;
        }
    }
    for a in 0..width {
        for b in 0..width {
            let ex = expected[a * width + b] * n;
            if ex >= 5.0 {
                let o = counts.get(&(a as u32, b as u32)).copied().unwrap_or(0) as f64;
                chi2 += (o - ex).powi(2) / ex;
                cells += 1;
            }
        }
    }
    Fit {
        chi2,
        critical: specrt_core::testing::chi2_quantile((cells - 1) as f64, z),
        cells,
        impossible,
        marked_observed: hits as f64 / n,
        marked_expected: (0..width as u32)
            .filter(|&t| marked(t))
            .map(|t| p1[t as usize])
            .sum(),
        draws,
        z,
    }
}
