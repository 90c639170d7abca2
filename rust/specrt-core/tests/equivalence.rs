//! Monte Carlo losslessness of one verification round (conventions.md rule 15).
//!
//! Model: a bigram "language model" over a vocabulary of 5 tokens, so row `i` of the target depends on the token
//! before it (position-dependent distributions). One draw runs whole draft -> verify rounds from context token 0
//! until two tokens are emitted, exactly as the decode loop does, and records the pair `(x1, x2)`. Lossless means
//! `P(x1, x2) = p(x1 | 0) * p(x2 | x1)` with `p` the processed target distribution (temperature / top-k / top-p /
//! min-p / penalties applied), whatever the draft, so both the first token and the second (which may come from the
//! same round or the next one) are checked, jointly.
//!
//! Test: Pearson chi-square over the 25 cells (cells with expected count < 5 pooled into one), against the
//! chi-square quantile at significance 1e-6 (Wilson-Hilferty approximation, z = 4.753), and every cell with
//! expected count 0 must be observed 0 times (p = 0 is never emitted). With fixed seeds the result is
//! deterministic; the significance only sets how far from p a correct sampler may land. A deliberately broken
//! sampler run through the same `run_case` must exceed the critical value.

use specrt_core::{verify, PenaltyContext, Rng, Sampler, SamplingParams, VerifyMode};

const V: usize = 5;
const DRAWS: usize = 100_000;
const CONTEXT_TOKEN: u32 = 0;

/// Target bigram table: row `prev` = p(next | prev). Row 2 gives token 2 probability 0.
const TARGET: [[f64; V]; V] = [
    [0.40, 0.25, 0.20, 0.10, 0.05],
    [0.05, 0.10, 0.50, 0.30, 0.05],
    [0.30, 0.30, 0.00, 0.20, 0.20],
    [0.10, 0.60, 0.10, 0.10, 0.10],
    [0.20, 0.20, 0.20, 0.20, 0.20],
];

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

/// How the draft relates to the target.
#[derive(Clone, Copy, Debug)]
enum DraftTable {
    /// q = p.
    Equal,
    /// Logits perturbed by up to +-0.4.
    Close,
    /// Each row reversed (target zero moves, mass lands where the target has little).
    Reversed,
    /// q = 0 on tokens 0 and 1 (the target gives them mass): recovered only through the residual.
    MissingMass,
    /// Uniform: proposes token 2 after token 2, where the target gives probability 0.
    Uniform,
}

fn draft_logits(table: DraftTable, prev: usize) -> [f32; V] {
    let t = logits_of(&TARGET[prev]);
    match table {
        DraftTable::Equal => t,
        DraftTable::Close => {
            let mut d = t;
            for (j, v) in d.iter_mut().enumerate() {
                #[allow(clippy::cast_precision_loss)]
                let bump = 0.4 * (((prev * 7 + j * 3) % 5) as f32 - 2.0) / 2.0;
                *v += bump;
            }
            d
        }
        DraftTable::Reversed => {
            let mut d = logits_of(&TARGET[prev]);
            d.reverse();
            d
        }
        DraftTable::MissingMass => {
            let mut d = [1.0f32, 1.0, 0.5, 0.0, -0.5];
            d[0] = f32::NEG_INFINITY;
            d[1] = f32::NEG_INFINITY;
            d
        }
        DraftTable::Uniform => [0.0; V],
    }
}

/// How draft tokens are proposed, and which rule verifies them.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Proposer {
    /// Sample from q, verify stochastically (correct).
    Sampled,
    /// Propose the draft argmax (a point mass), verify as deterministic drafts (correct).
    PointMass,
    /// BROKEN: propose the draft argmax but verify with the draft softmax q in the ratio.
    ArgmaxWithSoftmaxQ,
}

/// The verification rule under test: correct ([`verify`]) or broken.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rule {
    Correct,
    /// BROKEN: on rejection resample from p instead of norm(max(0, p - q)).
    NoResidual,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    table: DraftTable,
    params: SamplingParams,
    k: usize,
    proposer: Proposer,
    rule: Rule,
    seed: u64,
}

struct Outcome {
    /// [V * V] counts of (x1, x2).
    counts: Vec<u64>,
    /// First-round paths: [rejected at position 1, rejected later, all accepted + bonus].
    paths: [u64; 3],
}

/// The broken rule: same draws as `verify`, but the recovered token comes from p.
fn verify_no_residual(
    s: &mut Sampler,
    logits: &[f32],
    q: &[f32],
    d: &[u32],
    params: &SamplingParams,
    ctx: &mut PenaltyContext,
    rng: &mut Rng,
) -> Vec<u32> {
    let base = ctx.len();
    let mut out = Vec::new();
    for (i, &di) in d.iter().enumerate() {
        s.process(&logits[i * V..(i + 1) * V], i, params, Some(ctx))
            .unwrap();
        let p = s.prob(di);
        let qi = f64::from(q[i * V + di as usize]);
        if rng.next_f64() * qi >= p {
            out.push(s.sample_processed(rng.next_f64()));
            ctx.truncate(base);
            return out;
        }
        out.push(di);
        ctx.push(di).unwrap();
    }
    let k = d.len();
    s.process(&logits[k * V..], k, params, Some(ctx)).unwrap();
    out.push(s.sample_processed(rng.next_f64()));
    ctx.truncate(base);
    out
}

fn run_case(case: &Case, draws: usize) -> Outcome {
    let mut rng = Rng::seed_from_u64(case.seed);
    let mut s_tgt = Sampler::new(V);
    let mut s_dft = Sampler::new(V);
    let mut counts = vec![0u64; V * V];
    let mut paths = [0u64; 3];
    let k = case.k;
    // [k, V] draft rows, [k + 1, V] target logits.
    let mut q = vec![0f32; k * V];
    let mut logits = vec![0f32; (k + 1) * V];
    let mut d = vec![0u32; k];
    let draft_params = case.params;
    for _ in 0..draws {
        let mut ctx = PenaltyContext::new(V);
        let mut emitted: Vec<u32> = Vec::with_capacity(2 + k);
        let mut last = CONTEXT_TOKEN;
        let mut first_round = true;
        while emitted.len() < 2 {
            // Draft K tokens; penalties see the committed tokens plus the drafts so far.
            let committed = ctx.len();
            let mut prev = last;
            for i in 0..k {
                let dl = draft_logits(case.table, prev as usize);
                let qi = &mut q[i * V..(i + 1) * V];
                let tok = match case.proposer {
                    Proposer::Sampled => s_dft
                        .sample_draft(&dl, &draft_params, Some(&ctx), &mut rng, qi)
                        .unwrap(),
                    Proposer::PointMass | Proposer::ArgmaxWithSoftmaxQ => {
                        // Softmax q for the broken variant; the proposal itself is the argmax.
                        s_dft.process(&dl, i, &draft_params, Some(&ctx)).unwrap();
                        s_dft.write_probs(qi).unwrap();
                        let mut pen = dl;
                        ctx.apply(&draft_params, &mut pen);
                        specrt_core::sampling::checked_argmax(&pen, i).unwrap()
                    }
                };
                d[i] = tok;
                ctx.push(tok).unwrap();
                prev = tok;
            }
            ctx.truncate(committed);
            // Target rows: row i conditions on the token before d_{i+1}.
            let mut prev = last;
            for i in 0..=k {
                logits[i * V..(i + 1) * V].copy_from_slice(&logits_of(&TARGET[prev as usize]));
                if i < k {
                    prev = d[i];
                }
            }
            let tokens = match case.rule {
                Rule::Correct => {
                    let mode = if case.proposer == Proposer::PointMass {
                        VerifyMode::Deterministic
                    } else {
                        VerifyMode::Stochastic
                    };
                    verify(
                        &mut s_tgt,
                        &logits,
                        &q,
                        &d,
                        &case.params,
                        mode,
                        &mut ctx,
                        &mut rng,
                    )
                    .unwrap()
                    .tokens
                }
                Rule::NoResidual => verify_no_residual(
                    &mut s_tgt,
                    &logits,
                    &q,
                    &d,
                    &case.params,
                    &mut ctx,
                    &mut rng,
                ),
            };
            if first_round && k > 0 {
                let n_acc = tokens.len() - 1;
                let path = if n_acc == k {
                    2
                } else if n_acc == 0 {
                    0
                } else {
                    1
                };
                paths[path] += 1;
            }
            first_round = false;
            for &t in &tokens {
                ctx.push(t).unwrap();
            }
            last = *tokens.last().unwrap();
            emitted.extend_from_slice(&tokens);
        }
        counts[emitted[0] as usize * V + emitted[1] as usize] += 1;
    }
    Outcome { counts, paths }
}

/// Processed target distribution of row `prev` given the committed output tokens `ctx_tokens`.
fn target_probs(params: &SamplingParams, prev: usize, ctx_tokens: &[u32]) -> Vec<f64> {
    let mut s = Sampler::new(V);
    let mut ctx = PenaltyContext::new(V);
    for &t in ctx_tokens {
        ctx.push(t).unwrap();
    }
    s.process(&logits_of(&TARGET[prev]), 0, params, Some(&ctx))
        .unwrap();
    (0..V as u32).map(|t| s.prob(t)).collect()
}

/// Expected [V * V] joint probabilities of (x1, x2).
fn expected(params: &SamplingParams) -> Vec<f64> {
    let p1 = target_probs(params, CONTEXT_TOKEN as usize, &[]);
    let mut e = vec![0.0; V * V];
    for x1 in 0..V {
        #[allow(clippy::cast_possible_truncation)]
        let p2 = target_probs(params, x1, &[x1 as u32]);
        for x2 in 0..V {
            e[x1 * V + x2] = p1[x1] * p2[x2];
        }
    }
    e
}

/// Chi-square quantile at significance 1e-6 (Wilson-Hilferty): `df (1 - 2/(9 df) + z sqrt(2/(9 df)))^3`.
fn chi2_critical(df: usize) -> f64 {
    const Z: f64 = 4.753; // standard normal quantile at 1 - 1e-6
    #[allow(clippy::cast_precision_loss)]
    let d = df as f64;
    let c = 2.0 / (9.0 * d);
    d * (1.0 - c + Z * c.sqrt()).powi(3)
}

/// Returns (statistic, critical value), panicking if a zero-probability cell was observed.
fn chi_square(out: &Outcome, params: &SamplingParams, draws: usize) -> (f64, f64) {
    let probs = expected(params);
    #[allow(clippy::cast_precision_loss)]
    let n = draws as f64;
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pooled_o, mut pooled_e) = (0.0, 0.0);
    for (c, (&o, &p)) in out.counts.iter().zip(&probs).enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let o = o as f64;
        let e = p * n;
        if p == 0.0 {
            assert!(
                o == 0.0,
                "cell {c} has target probability 0 but was emitted {o} times"
            );
        } else if e < 5.0 {
            pooled_o += o;
            pooled_e += e;
        } else {
            stat += (o - e) * (o - e) / e;
            cells += 1;
        }
    }
    if pooled_e > 0.0 {
        stat += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
        cells += 1;
    }
    (stat, chi2_critical(cells - 1))
}

fn assert_lossless(case: Case) -> Outcome {
    let out = run_case(&case, DRAWS);
    let (stat, crit) = chi_square(&out, &case.params, DRAWS);
    eprintln!(
        "{:?} {:?} k={}: chi2 {stat:.1} (critical {crit:.1}), paths {:?}",
        case.table, case.proposer, case.k, out.paths
    );
    assert!(
        stat < crit,
        "{case:?}: chi-square {stat:.1} >= critical {crit:.1}; paths {:?}",
        out.paths
    );
    out
}

fn case(table: DraftTable, params: SamplingParams, k: usize, seed: u64) -> Case {
    Case {
        table,
        params,
        k,
        proposer: Proposer::Sampled,
        rule: Rule::Correct,
        seed,
    }
}

fn plain() -> SamplingParams {
    SamplingParams::default()
}

#[test]
fn draft_equal_to_target_preserves_distribution() {
    let out = assert_lossless(case(DraftTable::Equal, plain(), 3, 1));
    // q = p: never rejected.
    assert_eq!(out.paths[0] + out.paths[1], 0);
}

#[test]
fn draft_close_to_target_preserves_distribution_on_every_round_path() {
    let out = assert_lossless(case(DraftTable::Close, plain(), 3, 2));
    assert!(
        out.paths.iter().all(|&n| n > 1000),
        "paths (early, late, bonus) {:?}",
        out.paths
    );
}

#[test]
fn draft_reversed_preserves_distribution_on_every_round_path() {
    let out = assert_lossless(case(DraftTable::Reversed, plain(), 2, 3));
    assert!(
        out.paths.iter().all(|&n| n > 1000),
        "paths (early, late, bonus) {:?}",
        out.paths
    );
}

#[test]
fn draft_missing_target_mass_preserves_distribution() {
    assert_lossless(case(DraftTable::MissingMass, plain(), 2, 4));
}

#[test]
fn draft_proposing_zero_target_tokens_preserves_distribution() {
    assert_lossless(case(DraftTable::Uniform, plain(), 4, 5));
}

#[test]
fn single_draft_token_preserves_distribution() {
    assert_lossless(case(DraftTable::Reversed, plain(), 1, 6));
}

#[test]
fn temperature_preserves_distribution() {
    let params = SamplingParams {
        temperature: 0.6,
        ..plain()
    };
    assert_lossless(case(DraftTable::Reversed, params, 3, 7));
}

#[test]
fn top_k_preserves_distribution() {
    let params = SamplingParams {
        top_k: 3,
        temperature: 1.3,
        ..plain()
    };
    assert_lossless(case(DraftTable::Close, params, 3, 8));
}

#[test]
fn top_p_preserves_distribution() {
    let params = SamplingParams {
        top_p: 0.8,
        ..plain()
    };
    assert_lossless(case(DraftTable::Uniform, params, 2, 9));
}

#[test]
fn min_p_preserves_distribution() {
    let params = SamplingParams {
        min_p: 0.3,
        ..plain()
    };
    assert_lossless(case(DraftTable::Reversed, params, 2, 10));
}

#[test]
fn penalties_over_accepted_drafts_preserve_distribution() {
    let params = SamplingParams {
        repetition_penalty: 1.8,
        presence_penalty: 0.7,
        frequency_penalty: 0.3,
        ..plain()
    };
    assert_lossless(case(DraftTable::Close, params, 3, 11));
}

#[test]
fn deterministic_point_mass_drafts_preserve_distribution() {
    let mut c = case(DraftTable::Reversed, plain(), 3, 12);
    c.proposer = Proposer::PointMass;
    assert_lossless(c);
}

#[test]
fn broken_sampler_without_residual_is_caught() {
    let mut c = case(DraftTable::Reversed, plain(), 2, 13);
    c.rule = Rule::NoResidual;
    let out = run_case(&c, DRAWS);
    let (stat, crit) = chi_square(&out, &c.params, DRAWS);
    eprintln!(
        "broken {:?} {:?}: chi2 {stat:.1} (critical {crit:.1})",
        c.proposer, c.rule
    );
    assert!(
        stat > crit,
        "broken sampler passed: chi-square {stat:.1} < {crit:.1}"
    );
}

#[test]
fn broken_greedy_draft_with_softmax_ratio_is_caught() {
    let mut c = case(DraftTable::Close, plain(), 2, 14);
    c.proposer = Proposer::ArgmaxWithSoftmaxQ;
    let out = run_case(&c, DRAWS);
    let (stat, crit) = chi_square(&out, &c.params, DRAWS);
    eprintln!(
        "broken {:?} {:?}: chi2 {stat:.1} (critical {crit:.1})",
        c.proposer, c.rule
    );
    assert!(
        stat > crit,
        "broken sampler passed: chi-square {stat:.1} < {crit:.1}"
    );
}

#[test]
fn greedy_output_equals_target_argmax_chain() {
    let params = SamplingParams::greedy();
    let mut s = Sampler::new(V);
    let mut ctx = PenaltyContext::new(V);
    let mut rng = Rng::seed_from_u64(0);
    // Drafts [1, 2, 3] after context 0: target argmax chain from 0 is 0 -> 0 -> 0 ..., so d_1 = 1 is rejected.
    let mut logits = Vec::new();
    for prev in [0usize, 1, 2, 3] {
        logits.extend_from_slice(&logits_of(&TARGET[prev]));
    }
    let v = verify(
        &mut s,
        &logits,
        &[],
        &[1, 2, 3],
        &params,
        VerifyMode::Stochastic,
        &mut ctx,
        &mut rng,
    )
    .unwrap();
    assert_eq!(v.tokens, vec![0]);
    // Drafts [0, 0] follow the argmax chain: accepted, then the bonus is argmax of row 0 again.
    let logits: Vec<f32> = (0..3).flat_map(|_| logits_of(&TARGET[0])).collect();
    let before = rng.state();
    let v = verify(
        &mut s,
        &logits,
        &[],
        &[0, 0],
        &params,
        VerifyMode::Greedy,
        &mut ctx,
        &mut rng,
    )
    .unwrap();
    assert_eq!(v.tokens, vec![0, 0, 0]);
    assert_eq!(
        rng.state(),
        before,
        "greedy verification draws no random numbers"
    );
}
