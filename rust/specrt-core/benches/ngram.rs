//! N-gram (prompt lookup) proposer cost on a 16k-token context: per decode round (`propose` with k = 8, then
//! `extend` with 3 committed tokens, then `truncate` back so every iteration sees the same 16384-token context),
//! `propose` alone, and indexing the whole 16k context from empty (prefill of a long prompt).
//!
//! Contexts (seeded, vocab 32000):
//! - `code_edit`: a code-like file of ~8.4k tokens (lines drawn with repeats from a pool of 300 lines of 3..16
//!   Zipf-ish ids, shared indentation / punctuation ids), a short instruction, then the file being rewritten with
//!   edits (one identifier renamed everywhere, a few lines inserted), cut at 16384 tokens. The round extends with the
//!   next 3 tokens of the rewrite: the proposal matches, as in the code-editing workload.
//! - `random`: 16384 uniform ids over 151936 (no n-gram of length >= 2 repeats; 1-grams rarely do).
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use specrt_core::{NgramProposer, Rng};

const CTX: usize = 16_384;
const K: usize = 8;
const N_COMMIT: usize = 3;

fn below(rng: &mut Rng, n: u64) -> u64 {
    rng.next_u64() % n
}

/// Zipf-ish id in 0..32000: small ids (common tokens) far more often.
fn zipfish(rng: &mut Rng) -> u32 {
    let u = rng.next_f64();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let id = (32_000f64.powf(u * u) - 1.0) as u32;
    id.min(31_999)
}

/// (context of CTX tokens, the next tokens of the rewrite).
fn code_edit_context() -> (Vec<u32>, Vec<u32>) {
    let mut rng = Rng::seed_from_u64(7);
    let (indent, newline) = (220u32, 198u32);
    let pool: Vec<Vec<u32>> = (0..300)
        .map(|_| {
            let mut line = vec![indent; 1 + usize::try_from(below(&mut rng, 3)).unwrap()];
            let n = 3 + below(&mut rng, 14);
            line.extend((0..n).map(|_| zipfish(&mut rng)));
            line.push(newline);
            line
        })
        .collect();
    let mut file = Vec::new();
    while file.len() < 8_400 {
        #[allow(clippy::cast_possible_truncation)]
        let i = below(&mut rng, pool.len() as u64) as usize;
        file.extend_from_slice(&pool[i]);
    }
    // The rewrite: rename the most common non-structural id, insert a new line every ~1500 tokens.
    let renamed = file[1..]
        .iter()
        .copied()
        .find(|&t| t != indent && t != newline)
        .unwrap();
    let mut rewrite = Vec::with_capacity(file.len() + 200);
    for (i, &t) in file.iter().enumerate() {
        rewrite.push(if t == renamed { 31_000 } else { t });
        if t == newline && i % 1500 < 12 {
            rewrite.extend([indent, indent, 31_001, 31_002, 31_003, newline]);
        }
    }
    let instruction: Vec<u32> = (0..40).map(|_| zipfish(&mut rng)).collect();
    let mut ctx = file;
    ctx.extend_from_slice(&instruction);
    let m = CTX - ctx.len();
    ctx.extend_from_slice(&rewrite[..m]);
    (ctx, rewrite[m..m + N_COMMIT].to_vec())
}

fn random_context() -> (Vec<u32>, Vec<u32>) {
    let mut rng = Rng::seed_from_u64(8);
    #[allow(clippy::cast_possible_truncation)]
    let mut all: Vec<u32> = (0..CTX + N_COMMIT)
        .map(|_| below(&mut rng, 151_936) as u32)
        .collect();
    let next = all.split_off(CTX);
    (all, next)
}

fn bench_ngram(c: &mut Criterion) {
    let mut g = c.benchmark_group("ngram");
    g.sample_size(40)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (name, (ctx, next)) in [
        ("code_edit", code_edit_context()),
        ("random", random_context()),
    ] {
        for (min_n, max_n) in [(1, 4), (2, 32)] {
            let mut p = NgramProposer::new(min_n, max_n).unwrap();
            p.extend(&ctx);
            let mut out = Vec::with_capacity(K);
            let n = p.propose(K, &mut out);
            eprintln!("{name} min_n={min_n} max_n={max_n}: proposal of {n} tokens");
            let tag = format!("ctx={CTX} {name} min_n={min_n} max_n={max_n}");
            g.bench_function(
                format!("round (propose k={K} + extend {N_COMMIT} + truncate) {tag}"),
                |b| {
                    b.iter(|| {
                        black_box(p.propose(black_box(K), &mut out));
                        p.extend(black_box(&next));
                        p.truncate(CTX);
                    });
                },
            );
            g.bench_function(format!("propose k={K} {tag}"), |b| {
                b.iter(|| black_box(p.propose(black_box(K), &mut out)));
            });
            let mut fresh = NgramProposer::new(min_n, max_n).unwrap();
            fresh.extend(&ctx);
            g.bench_function(
                format!("index whole context (reset + extend {CTX}) {tag}"),
                |b| {
                    b.iter(|| {
                        fresh.reset();
                        fresh.extend(black_box(&ctx));
                    });
                },
            );
        }
    }
    g.finish();
}

criterion_group!(benches, bench_ngram);
criterion_main!(benches);
