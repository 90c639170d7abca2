//! One verification round at k in {1, 4, 8}, vocab in {32000, 151936}, on synthetic LLM-like logits.
//!
//! Logits: N(0, 2) noise plus a peaked head (5 tokens boosted by +16, +15, .., +12), so the top token has
//! probability ~0.6 at vocab 151936 (~0.63 at 32000) and top-p 0.9 keeps the head plus part of the tail. The draft sees the target logits plus N(0, 1) noise. Variants:
//! - `realistic`: drafts sampled from q; rejections happen where they happen (seeded, same inputs each iteration).
//! - `all_accepted`: q = p (same rows) so all k drafts are accepted and the bonus row is sampled (k + 1 rows).
//! - `greedy`: temperature 0, drafts = target argmax (all accepted, k + 1 argmax rows).
//!
//! Group `logprob`: the engine's per-round log-probabilities of k + 1 = 5 emitted tokens at vocab 151936, by
//! `log_softmax_at` (two passes per row) and by `log_softmax_with` from `Verification::row_norms` (no pass).
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use specrt_core::sampling::{log_softmax_at, log_softmax_with};
use specrt_core::{verify, PenaltyContext, Rng, Sampler, SamplingParams, VerifyMode};

fn logits(rows: usize, vocab: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(rows * vocab);
    for _ in 0..rows {
        for _ in 0..vocab {
            // Box-Muller, N(0, 2).
            let (u1, u2) = (rng.next_f64().max(1e-300), rng.next_f64());
            #[allow(clippy::cast_possible_truncation)]
            out.push((2.0 * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32);
        }
        let base = out.len() - vocab;
        for j in 0..5u32 {
            #[allow(clippy::cast_possible_truncation)]
            let idx = (rng.next_u64() % vocab as u64) as usize;
            #[allow(clippy::cast_precision_loss)]
            let boost = 16.0 - j as f32;
            out[base + idx] += boost;
        }
    }
    out
}

struct Inputs {
    target: Vec<f32>,
    q: Vec<f32>,
    d: Vec<u32>,
}

fn inputs(k: usize, vocab: usize, params: &SamplingParams, same: bool) -> Inputs {
    let target = logits(k + 1, vocab, 1);
    let noise = logits(k, vocab, 2);
    let mut s = Sampler::new(vocab);
    let mut rng = Rng::seed_from_u64(3);
    let mut q = vec![0f32; k * vocab];
    let mut d = Vec::with_capacity(k);
    for i in 0..k {
        let row: Vec<f32> = if same {
            target[i * vocab..(i + 1) * vocab].to_vec()
        } else {
            (0..vocab)
                .map(|j| target[i * vocab + j] + 0.5 * noise[i * vocab + j])
                .collect()
        };
        let t = s
            .sample_draft(
                &row,
                params,
                None,
                &mut rng,
                &mut q[i * vocab..(i + 1) * vocab],
            )
            .unwrap();
        d.push(t);
    }
    Inputs { target, q, d }
}

fn bench_verify(c: &mut Criterion) {
    let stochastic = SamplingParams {
        top_p: 0.9,
        ..SamplingParams::default()
    };
    let greedy = SamplingParams::greedy();
    let mut group = c.benchmark_group("verify");
    for vocab in [32_000usize, 151_936] {
        for k in [1usize, 4, 8] {
            for (variant, params, same) in [
                ("realistic T=1 top_p=0.9", &stochastic, false),
                ("all_accepted T=1 top_p=0.9", &stochastic, true),
                ("greedy", &greedy, true),
            ] {
                let mut inp = inputs(k, vocab, params, same);
                if variant == "greedy" {
                    let mut s = Sampler::new(vocab);
                    for i in 0..k {
                        inp.d[i] = s
                            .argmax(&inp.target[i * vocab..(i + 1) * vocab], i, params, None)
                            .unwrap();
                    }
                }
                let mut s = Sampler::new(vocab);
                let mut ctx = PenaltyContext::new(vocab);
                let id = BenchmarkId::new(variant, format!("k={k} vocab={vocab}"));
                let mut seed = 0u64;
                group.bench_with_input(id, &inp, |b, inp| {
                    b.iter(|| {
                        // A different stream each iteration: the rejection pattern varies as in real decoding.
                        seed += 1;
                        let mut rng = Rng::seed_from_u64(seed);
                        black_box(
                            verify(
                                &mut s,
                                &inp.target,
                                &inp.q,
                                &inp.d,
                                params,
                                VerifyMode::Stochastic,
                                &mut ctx,
                                &mut rng,
                            )
                            .unwrap(),
                        )
                    });
                });
            }
        }
    }
    group.finish();
}

fn bench_logprob(c: &mut Criterion) {
    let (k, vocab) = (4usize, 151_936usize);
    let params = SamplingParams {
        top_p: 0.9,
        ..SamplingParams::default()
    };
    let inp = inputs(k, vocab, &params, true);
    let mut s = Sampler::new(vocab);
    let mut ctx = PenaltyContext::new(vocab);
    let mut rng = Rng::seed_from_u64(7);
    let v = verify(
        &mut s,
        &inp.target,
        &inp.q,
        &inp.d,
        &params,
        VerifyMode::Stochastic,
        &mut ctx,
        &mut rng,
    )
    .unwrap();
    assert_eq!(v.tokens.len(), k + 1);
    let mut group = c.benchmark_group("logprob");
    group.bench_function("log_softmax_at k+1=5 rows vocab=151936", |b| {
        b.iter(|| {
            let mut acc = 0f32;
            for (i, &t) in v.tokens.iter().enumerate() {
                acc += log_softmax_at(&inp.target[i * vocab..(i + 1) * vocab], t, i).unwrap();
            }
            black_box(acc)
        });
    });
    group.bench_function("log_softmax_with k+1=5 rows vocab=151936", |b| {
        b.iter(|| {
            let mut acc = 0f32;
            for (i, &t) in v.tokens.iter().enumerate() {
                let row = &inp.target[i * vocab..(i + 1) * vocab];
                acc += log_softmax_with(row, t, v.row_norms[i].unwrap()).unwrap();
            }
            black_box(acc)
        });
    });
    group.finish();
}

criterion_group!(benches, bench_verify, bench_logprob);
criterion_main!(benches);
