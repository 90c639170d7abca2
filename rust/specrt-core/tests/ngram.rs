//! The n-gram (prompt lookup) proposer: proposals equal a brute-force rescan of the history on random sequences
//! (proptest), truncate + extend equals building from scratch, the repetitive "serving" x 48 prompt drafts k
//! tokens every round, config errors; and Monte Carlo losslessness of its point-mass drafts through
//! `verify(.., VerifyMode::Deterministic, ..)`, including a draft token the target gives probability 0, with a
//! deliberately broken rule caught by the same test (conventions.md rule 15).

use proptest::prelude::*;
use specrt_core::{
    verify, NgramProposer, PenaltyContext, Rng, Sampler, SamplingParams, SpecError, VerifyMode,
};

/// Obviously-correct reference: rescan the whole history for the longest n in `[min_n, max_n]` whose last n tokens
/// occurred earlier (ending strictly before the end), take its most recent occurrence, and copy what followed it
/// token by token, reading the proposal itself once the copy passes the end (overlapping copy).
fn reference(tokens: &[u32], min_n: usize, max_n: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    for n in (min_n..=max_n.min(len)).rev() {
        let suffix = &tokens[len - n..];
        if let Some(end) = (n..len).rev().find(|&e| &tokens[e - n..e] == suffix) {
            let mut seq = tokens.to_vec();
            for j in 0..k {
                seq.push(seq[end + j]);
            }
            return seq[len..].to_vec();
        }
    }
    Vec::new()
}

fn proposal(p: &NgramProposer, k: usize) -> Vec<u32> {
    let mut out = vec![u32::MAX; 3]; // stale content must be cleared
    let n = p.propose(k, &mut out);
    assert_eq!(n, out.len());
    out
}

#[derive(Debug, Clone)]
enum Op {
    Extend(Vec<u32>),
    Truncate(usize),
}

fn ops(alphabet: u32) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            6 => prop::collection::vec(0..alphabet, 1..12).prop_map(Op::Extend),
            1 => (0usize..40).prop_map(Op::Truncate),
        ],
        1..40,
    )
}

fn config() -> impl Strategy<Value = (usize, usize, usize)> {
    (1usize..6, 0usize..6, 0usize..10).prop_map(|(lo, extra, k)| (lo, lo + extra, k))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// After every extend / truncate (small alphabets: lots of repeats, overlaps, periodic runs), the proposal for
    /// every k in 0..=12 equals the brute-force rescan.
    #[test]
    fn proposals_equal_brute_force_rescan(
        alphabet in 1u32..5,
        (min_n, max_n, _) in config(),
        seed_ops in (1u32..5).prop_flat_map(ops),
    ) {
        let mut p = NgramProposer::new(min_n, max_n).unwrap();
        let mut model: Vec<u32> = Vec::new();
        for op in &seed_ops {
            match op {
                Op::Extend(t) => {
                    let t: Vec<u32> = t.iter().map(|x| x % alphabet).collect();
                    // Half the time one token at a time (as the engine commits), else in one call.
                    if t.len().is_multiple_of(2) {
                        for &x in &t { p.extend(&[x]); }
                    } else {
                        p.extend(&t);
                    }
                    model.extend_from_slice(&t);
                }
                Op::Truncate(n) => {
                    p.truncate(*n);
                    model.truncate(*n);
                }
            }
            prop_assert_eq!(p.len(), model.len());
            prop_assert_eq!(p.tokens(), &model[..]);
            for k in 0..=12 {
                prop_assert_eq!(proposal(&p, k), reference(&model, min_n, max_n, k),
                    "tokens {:?} min_n {} max_n {} k {}", model, min_n, max_n, k);
            }
        }
    }

    /// Long sequences over 2..8 symbols with large max_n (up to 32): equal to the rescan at every prefix.
    #[test]
    fn proposals_equal_brute_force_on_long_sequences_with_large_max_n(
        tokens in prop::collection::vec(0u32..3, 0..300),
        min_n in 1usize..8,
        extra in 0usize..26,
        k in 1usize..10,
    ) {
        let max_n = min_n + extra;
        let mut p = NgramProposer::new(min_n, max_n).unwrap();
        for (i, &t) in tokens.iter().enumerate() {
            p.extend(&[t]);
            prop_assert_eq!(proposal(&p, k), reference(&tokens[..=i], min_n, max_n, k));
        }
    }

    /// Truncating to `cut` and extending with `tail` behaves exactly like a proposer built from scratch on the
    /// same tokens (checked on every prefix of a further extension).
    #[test]
    fn truncate_then_extend_equals_building_from_scratch(
        (min_n, max_n, k) in config(),
        base in prop::collection::vec(0u32..4, 0..120),
        cut_frac in 0.0f64..=1.0,
        tail in prop::collection::vec(0u32..4, 0..40),
        more in prop::collection::vec(0u32..4, 0..30),
    ) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let cut = (base.len() as f64 * cut_frac) as usize;
        let mut a = NgramProposer::new(min_n, max_n).unwrap();
        a.extend(&base);
        a.truncate(cut);
        a.extend(&tail);
        let mut b = NgramProposer::new(min_n, max_n).unwrap();
        b.extend(&base[..cut]);
        b.extend(&tail);
        // Also a reset proposer reused: reset forgets everything.
        let mut c = NgramProposer::new(min_n, max_n).unwrap();
        c.extend(&more);
        c.reset();
        prop_assert!(c.is_empty());
        c.extend(&base[..cut]);
        c.extend(&tail);
        for &t in std::iter::once(&u32::MAX).chain(&more) {
            if t != u32::MAX {
                a.extend(&[t]);
                b.extend(&[t]);
                c.extend(&[t]);
            }
            prop_assert_eq!(a.tokens(), b.tokens());
            for kk in [k, 1, 8] {
                prop_assert_eq!(proposal(&a, kk), proposal(&b, kk));
                prop_assert_eq!(proposal(&c, kk), proposal(&b, kk));
            }
        }
    }
}

/// Decode-loop simulation on a periodic text: every round proposes, the "target" emits the true continuation of
/// the pattern (all drafts correct, plus one bonus token), the proposer is extended with it.
fn assert_repetitive_prompt_drafts_k_every_round(pattern: &[u32], min_n: usize, max_n: usize) {
    let k = 8;
    let prompt: Vec<u32> = pattern
        .iter()
        .copied()
        .cycle()
        .take(48 * pattern.len())
        .collect();
    let mut p = NgramProposer::new(min_n, max_n).unwrap();
    p.extend(&prompt);
    let mut out = Vec::with_capacity(k);
    for round in 0..40 {
        let len = p.len();
        let n = p.propose(k, &mut out);
        let truth: Vec<u32> = (len..len + k + 1)
            .map(|i| pattern[i % pattern.len()])
            .collect();
        assert_eq!(n, k, "round {round}: pattern {pattern:?} proposed {out:?}");
        assert_eq!(out[..], truth[..k], "round {round}: pattern {pattern:?}");
        p.extend(&truth);
    }
}

#[test]
fn serving_repeated_48_times_proposes_k_tokens_every_round() {
    // " serving" as one token (period 1), as "serv" + "ing" (period 2), spelled out letter by letter (period 7),
    // and with a separator (period 8 = k).
    assert_repetitive_prompt_drafts_k_every_round(&[13_480], 1, 4);
    assert_repetitive_prompt_drafts_k_every_round(&[3_574, 287], 1, 4);
    let letters: Vec<u32> = "serving".bytes().map(u32::from).collect();
    assert_repetitive_prompt_drafts_k_every_round(&letters, 1, 4);
    assert_repetitive_prompt_drafts_k_every_round(&letters, 3, 5);
    let spaced: Vec<u32> = " serving".bytes().map(u32::from).collect();
    assert_repetitive_prompt_drafts_k_every_round(&spaced, 2, 32);
}

#[test]
fn config_outside_one_to_thirty_two_is_an_error() {
    for (lo, hi) in [(0, 0), (0, 4), (5, 4), (1, 33), (33, 33)] {
        match NgramProposer::new(lo, hi) {
            Err(SpecError::Setting { message: m, .. }) => assert!(
                m.contains(&lo.to_string())
                    && m.contains(&hi.to_string())
                    && m.contains("expected 1 <= prompt_lookup_min <= prompt_lookup_max <= 32"),
                "{m}"
            ),
            other => panic!("({lo}, {hi}): expected a Config error, got {other:?}"),
        }
    }
    let p = NgramProposer::new(2, 5).unwrap();
    assert_eq!((p.min_n(), p.max_n(), p.len()), (2, 5, 0));
}

#[test]
fn proposal_reuses_the_output_buffer() {
    let mut p = NgramProposer::new(1, 3).unwrap();
    let text: Vec<u32> = (0..2000u32).map(|i| (i * 7 + i / 13) % 50).collect();
    p.extend(&text);
    let mut out = Vec::with_capacity(8);
    let ptr = out.as_ptr();
    for t in 0..200u32 {
        p.propose(8, &mut out);
        assert_eq!(out.as_ptr(), ptr, "propose reallocated");
        p.extend(&[t % 50]);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Monte Carlo losslessness of n-gram drafts (point masses) through `verify` in Deterministic mode.
//
// Model: a bigram target over V = 5 tokens (row `prev` = p(next | prev)); row 2 gives token 2 probability 0. One
// draw decodes from a fixed prompt until two tokens are emitted: each round the n-gram proposer (over the prompt
// and everything emitted so far) drafts up to K tokens, the target rows are the bigram rows along the drafts, and
// `verify` accepts / recovers / adds the bonus token. Lossless means P(x1, x2) = p(x1 | last) * p(x2 | x1) with p
// the processed target distribution, whatever the drafts. Pearson chi-square over the 25 cells (expected count < 5
// pooled), critical value at significance 1e-6 from the number of cells (Wilson-Hilferty, z = 4.753); a cell of
// probability 0 must never be observed.

const V: usize = 5;
const DRAWS: usize = 100_000;

const TARGET: [[f64; V]; V] = [
    [0.40, 0.25, 0.20, 0.10, 0.05],
    [0.05, 0.10, 0.50, 0.30, 0.05],
    [0.30, 0.30, 0.00, 0.20, 0.20],
    [0.10, 0.60, 0.10, 0.10, 0.10],
    [0.20, 0.20, 0.20, 0.20, 0.20],
];

/// Prompt whose first proposal is `[2, 2, 4]` after last token 0: suffix `[1, 0]` matches at 0..2. `d_2 = 2`
/// follows `d_1 = 2`, where the target gives probability 0 (always rejected; recovered from p(. | 2)).
const PROMPT_ZERO_MASS_DRAFT: [u32; 7] = [1, 0, 2, 2, 4, 1, 0];
/// Prompt `[0, 0, 0, 0]`: proposals are `[0, 0, 0]` (overlapping copy), accepted with p = 0.4 each, so every
/// round path occurs: reject at d_1 (60%), later (33.6%), all accepted + bonus (6.4%).
const PROMPT_RUN: [u32; 4] = [0, 0, 0, 0];

fn logits_of(p: &[f64; V]) -> [f32; V] {
    #[allow(clippy::cast_possible_truncation)]
    p.map(|v| {
        if v > 0.0 {
            v.ln() as f32
        } else {
            f32::NEG_INFINITY
        }
    })
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Rule {
    /// `verify(.., VerifyMode::Deterministic, ..)`.
    Correct,
    /// BROKEN: on rejection sample from p without removing the rejected draft token x.
    RejectFromFullP,
}

#[derive(Clone, Copy, Debug)]
struct McCase {
    prompt: &'static [u32],
    params: SamplingParams,
    k: usize,
    rule: Rule,
    seed: u64,
}

struct Outcome {
    /// [V * V] counts of (x1, x2).
    counts: Vec<u64>,
    /// First-round paths: [rejected at d_1, rejected later, all accepted + bonus, no proposal].
    paths: [u64; 4],
    /// Draft tokens proposed with target probability 0, over all rounds (evaluated or not).
    n_zero_mass_drafts: u64,
}

/// The broken rule: the same draws as `verify` in Deterministic mode, but the recovered token comes from p.
fn verify_reject_from_full_p(
    s: &mut Sampler,
    logits: &[f32],
    d: &[u32],
    params: &SamplingParams,
    rng: &mut Rng,
) -> Vec<u32> {
    let mut out = Vec::new();
    for (i, &di) in d.iter().enumerate() {
        s.process(&logits[i * V..(i + 1) * V], i, params, None)
            .unwrap();
        if rng.next_f64() >= s.prob(di) {
            out.push(s.sample_processed(rng.next_f64()));
            return out;
        }
        out.push(di);
    }
    let k = d.len();
    s.process(&logits[k * V..], k, params, None).unwrap();
    out.push(s.sample_processed(rng.next_f64()));
    out
}

fn run_mc(case: &McCase, draws: usize) -> Outcome {
    let mut rng = Rng::seed_from_u64(case.seed);
    let mut s = Sampler::new(V);
    let mut ngram = NgramProposer::new(1, 3).unwrap();
    let mut counts = vec![0u64; V * V];
    let mut paths = [0u64; 4];
    let mut n_zero_mass_drafts = 0;
    let mut drafts = Vec::with_capacity(case.k);
    // [k + 1, V] target logits.
    let mut logits = vec![0f32; (case.k + 1) * V];
    for _ in 0..draws {
        ngram.reset();
        ngram.extend(case.prompt);
        let mut ctx = PenaltyContext::new(V);
        let mut emitted: Vec<u32> = Vec::with_capacity(2 + case.k);
        let mut first_round = true;
        while emitted.len() < 2 {
            let k = ngram.propose(case.k, &mut drafts);
            let mut prev = *ngram.tokens().last().unwrap() as usize;
            for i in 0..=k {
                logits[i * V..(i + 1) * V].copy_from_slice(&logits_of(&TARGET[prev]));
                if i < k {
                    n_zero_mass_drafts += u64::from(TARGET[prev][drafts[i] as usize] == 0.0);
                    prev = drafts[i] as usize;
                }
            }
            let logits = &logits[..(k + 1) * V];
            let tokens = match case.rule {
                Rule::Correct => {
                    verify(
                        &mut s,
                        logits,
                        &[],
                        &drafts,
                        &case.params,
                        VerifyMode::Deterministic,
                        &mut ctx,
                        &mut rng,
                    )
                    .unwrap()
                    .tokens
                }
                Rule::RejectFromFullP => {
                    verify_reject_from_full_p(&mut s, logits, &drafts, &case.params, &mut rng)
                }
            };
            if first_round {
                let n_acc = tokens.len() - 1;
                paths[match (k, n_acc) {
                    (0, _) => 3,
                    (_, 0) => 0,
                    _ if n_acc == k => 2,
                    _ => 1,
                }] += 1;
                first_round = false;
            }
            ngram.extend(&tokens);
            emitted.extend_from_slice(&tokens);
        }
        counts[emitted[0] as usize * V + emitted[1] as usize] += 1;
    }
    Outcome {
        counts,
        paths,
        n_zero_mass_drafts,
    }
}

fn target_probs(params: &SamplingParams, prev: usize) -> Vec<f64> {
    let mut s = Sampler::new(V);
    s.process(&logits_of(&TARGET[prev]), 0, params, None)
        .unwrap();
    (0..V as u32).map(|t| s.prob(t)).collect()
}

fn chi2_critical(df: usize) -> f64 {
    const Z: f64 = 4.753; // standard normal quantile at 1 - 1e-6
    #[allow(clippy::cast_precision_loss)]
    let d = df as f64;
    let c = 2.0 / (9.0 * d);
    d * (1.0 - c + Z * c.sqrt()).powi(3)
}

/// (statistic, critical value); panics if a cell of probability 0 was observed.
fn chi_square(case: &McCase, out: &Outcome, draws: usize) -> (f64, f64) {
    let last = *case.prompt.last().unwrap() as usize;
    let p1 = target_probs(&case.params, last);
    #[allow(clippy::cast_precision_loss)]
    let n = draws as f64;
    let (mut stat, mut cells, mut pooled_o, mut pooled_e) = (0.0, 0usize, 0.0, 0.0);
    for (x1, &p_x1) in p1.iter().enumerate() {
        let p2 = target_probs(&case.params, x1);
        for (x2, &p_x2) in p2.iter().enumerate() {
            let p = p_x1 * p_x2;
            #[allow(clippy::cast_precision_loss)]
            let o = out.counts[x1 * V + x2] as f64;
            let e = p * n;
            if p == 0.0 {
                assert!(
                    o == 0.0,
                    "({x1}, {x2}) has probability 0 but was emitted {o} times"
                );
            } else if e < 5.0 {
                pooled_o += o;
                pooled_e += e;
            } else {
                stat += (o - e) * (o - e) / e;
                cells += 1;
            }
        }
    }
    if pooled_e > 0.0 {
        stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
        cells += 1;
    }
    (stat, chi2_critical(cells - 1))
}

fn assert_mc_lossless(case: McCase) -> Outcome {
    let out = run_mc(&case, DRAWS);
    let (stat, crit) = chi_square(&case, &out, DRAWS);
    eprintln!(
        "prompt {:?} k={}: chi2 {stat:.1} (critical {crit:.1}), paths {:?}, zero-mass drafts {}",
        case.prompt, case.k, out.paths, out.n_zero_mass_drafts
    );
    assert!(
        stat < crit,
        "{case:?}: chi-square {stat:.1} >= critical {crit:.1}; paths {:?}",
        out.paths
    );
    out
}

fn mc(prompt: &'static [u32], params: SamplingParams, k: usize, seed: u64) -> McCase {
    McCase {
        prompt,
        params,
        k,
        rule: Rule::Correct,
        seed,
    }
}

#[test]
fn ngram_drafts_with_a_zero_target_probability_token_preserve_distribution() {
    let out = assert_mc_lossless(mc(
        &PROMPT_ZERO_MASS_DRAFT,
        SamplingParams::default(),
        3,
        21,
    ));
    // Every first round proposes d_2 = 2 after d_1 = 2; d_1 is accepted with p(2 | 0) = 0.2, and then d_2
    // (probability 0) is evaluated and always rejected: the "rejected later" path, about 20% of first rounds.
    assert!(
        out.n_zero_mass_drafts >= DRAWS as u64,
        "{}",
        out.n_zero_mass_drafts
    );
    assert!(out.paths[1] > 18_000, "paths {:?}", out.paths);
    assert_eq!(out.paths[2] + out.paths[3], 0, "d_2 can never be accepted");
}

#[test]
fn ngram_drafts_preserve_distribution_on_every_round_path() {
    let out = assert_mc_lossless(mc(&PROMPT_RUN, SamplingParams::default(), 3, 22));
    assert!(
        out.paths[..3].iter().all(|&n| n > 3000),
        "paths (early, late, bonus, none) {:?}",
        out.paths
    );
}

#[test]
fn ngram_drafts_preserve_distribution_with_temperature_and_top_k() {
    // top_k = 3 at row 0 keeps {0, 1, 2}; at row 2 {0, 1} and one of the 0.2s: drafts outside it have p = 0.
    let params = SamplingParams {
        temperature: 0.7,
        top_k: 3,
        ..SamplingParams::default()
    };
    assert_mc_lossless(mc(&PROMPT_ZERO_MASS_DRAFT, params, 4, 23));
    assert_mc_lossless(mc(&PROMPT_RUN, params, 2, 24));
}

#[test]
fn broken_rule_resampling_from_full_p_on_rejection_is_caught() {
    // Prompt with d_1 = 2, p(2 | 0) = 0.2: the broken rule emits x1 = 2 with 0.2 + 0.8 * 0.2 = 0.36.
    let case = McCase {
        rule: Rule::RejectFromFullP,
        ..mc(&PROMPT_ZERO_MASS_DRAFT, SamplingParams::default(), 3, 21)
    };
    let out = run_mc(&case, DRAWS);
    let (stat, crit) = chi_square(&case, &out, DRAWS);
    eprintln!("broken rule: chi2 {stat:.1} (critical {crit:.1})");
    assert!(
        stat > crit,
        "broken rule passed: chi-square {stat:.1} < {crit:.1}"
    );
}
