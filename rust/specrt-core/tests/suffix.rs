//! Suffix decoding: its proposals equal a brute-force rescan of the history on random sequences (proptest); through
//! both engines, greedy output equals target-only token for token and coupled sampling at T = 1 equals target-only
//! coupled decoding, alone and with the draft model; a shared cache makes a repeated request draft (and accept) what
//! the earlier one emitted, while each request's output stays the target's.

mod common;

use std::sync::Arc;

use common::run_batch;
use proptest::prelude::*;
use specrt_core::testing::{MockBatchModel, MockModel};
use specrt_core::{
    Backend, BatchBackend, BatchEngine, BatchOptions, Engine, GenerationConfig, LookupMethod,
    NgramConfig, SamplingParams, SuffixCache, SuffixProposer, SUFFIX_MAX_DEPTH,
};

const VOCAB: usize = 64;
const MAX_SEQ: usize = 512;
/// The proposer's probability floor and spec factor (the crate's constants), restated for the reference.
const MIN_PROB: f64 = 0.1;
const SPEC_FACTOR: f64 = 1.0;

/// Obviously-correct reference: at each step rescan `seq` (the history, then the path so far) for the deepest
/// context of `min..=SUFFIX_MAX_DEPTH` tokens that ends `seq` and occurred earlier with a continuation; count its
/// continuations in position order and take the first token to reach the largest count; stop below the probability
/// floor, at `ceil(SPEC_FACTOR * depth)` tokens for the first step's depth, or at `k`.
fn reference(tokens: &[u32], min: usize, k: usize) -> Vec<u32> {
    let mut seq = tokens.to_vec();
    let mut out = Vec::new();
    let (mut prob, mut limit) = (1.0f64, k);
    while out.len() < limit {
        let len = seq.len();
        // Only the history's continuations count (the path's own tokens are not indexed).
        let hist = tokens.len();
        let mut found = None;
        for n in (min..=SUFFIX_MAX_DEPTH.min(len)).rev() {
            let ctx = &seq[len - n..];
            let mut counts: Vec<(u32, u32)> = Vec::new();
            let (mut best, mut total) = (None::<(u32, u32)>, 0u32);
            for end in n..hist {
                if &tokens[end - n..end] == ctx {
                    let t = tokens[end];
                    total += 1;
                    let c = match counts.iter_mut().find(|(u, _)| *u == t) {
                        Some(e) => {
                            e.1 += 1;
                            e.1
                        }
                        None => {
                            counts.push((t, 1));
                            1
                        }
                    };
                    if best.is_none_or(|(_, b)| c > b) {
                        best = Some((t, c));
                    }
                }
            }
            if let Some((t, c)) = best {
                found = Some((n, t, c, total));
                break;
            }
        }
        let Some((depth, t, c, total)) = found else {
            break;
        };
        prob *= f64::from(c) / f64::from(total);
        if prob < MIN_PROB {
            break;
        }
        if out.is_empty() {
            limit = k.min((SPEC_FACTOR * depth as f64).ceil() as usize).max(1);
        }
        out.push(t);
        seq.push(t);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Small alphabets (many repeats and ties) and truncations: the proposal always equals the rescan's.
    #[test]
    fn proposals_equal_a_brute_force_rescan(
        chunks in prop::collection::vec(prop::collection::vec(0u32..5, 1..12), 1..12),
        cut in prop::option::of(0usize..60),
        min in 1usize..4,
        k in 0usize..10,
    ) {
        let mut p = SuffixProposer::new(min, None).unwrap();
        let mut all = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            p.extend(c);
            all.extend_from_slice(c);
            if i == chunks.len() / 2 {
                if let Some(cut) = cut {
                    p.truncate(cut);
                    all.truncate(cut);
                }
            }
            let mut out = vec![u32::MAX; 2];
            let n = p.propose(k, &mut out);
            prop_assert_eq!(n, out.len());
            prop_assert_eq!(&out, &reference(&all, min, k), "tokens {:?}", all);
        }
    }
}

fn target(seed: u64) -> MockModel {
    MockModel::new(VOCAB, MAX_SEQ, seed, 4.0)
}

fn draft(seed: u64) -> MockModel {
    target(seed).with_noise(seed + 1000, 0.6)
}

fn suffix(
    k: usize,
    max_new: usize,
    use_draft_model: bool,
    sampling: SamplingParams,
) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: max_new,
        num_speculative_tokens: k,
        sampling,
        ngram: Some(NgramConfig {
            prompt_lookup_min: 2,
            prompt_lookup_max: 4,
            method: LookupMethod::Suffix,
        }),
        use_draft_model,
        ..GenerationConfig::default()
    }
}

fn plain(max_new: usize, sampling: SamplingParams) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: max_new,
        num_speculative_tokens: 0,
        sampling,
        ..GenerationConfig::default()
    }
}

fn engine(seed: u64, with_draft: bool) -> Engine {
    let d = with_draft.then(|| Box::new(draft(seed)) as Box<dyn Backend>);
    Engine::new(Box::new(target(seed)), d).unwrap()
}

fn batch_engine(seed: u64, with_draft: bool, max_batch: usize) -> BatchEngine {
    let d = with_draft
        .then(|| Box::new(MockBatchModel::new(&draft(seed), max_batch)) as Box<dyn BatchBackend>);
    BatchEngine::new(
        Box::new(MockBatchModel::new(&target(seed), max_batch)),
        d,
        BatchOptions::default(),
    )
    .unwrap()
}

fn greedy() -> SamplingParams {
    SamplingParams::greedy()
}

fn t1() -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    }
}

/// Prompts with repeats (so the request's own text offers matches).
fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![1, 2, 3],
        (0..30).map(|i| [5u32, 6, 7, 1][i % 4]).collect(),
        vec![40, 41, 7, 7, 2, 40, 41, 7],
    ]
}

#[test]
fn greedy_suffix_decoding_equals_target_only_in_both_engines() {
    for seed in [3u64, 4, 5] {
        for with_draft in [false, true] {
            let cache = SuffixCache::new(10_000).unwrap();
            let mut single = engine(seed, with_draft);
            single.set_suffix_cache(Some(Arc::clone(&cache)));
            let mut batched = batch_engine(seed, with_draft, 3);
            batched.set_suffix_cache(Some(Arc::clone(&cache)));
            for k in [1usize, 4, 8] {
                let reqs: Vec<(Vec<u32>, GenerationConfig)> = prompts()
                    .into_iter()
                    .map(|p| (p, suffix(k, 40, with_draft, greedy())))
                    .collect();
                let outs = run_batch(&mut batched, &reqs);
                for ((p, cfg), b) in reqs.iter().zip(&outs) {
                    let reference = engine(seed, false)
                        .generate(p, plain(40, greedy()), |_| true)
                        .unwrap();
                    let s = single.generate(p, cfg.clone(), |_| true).unwrap();
                    assert_eq!(
                        s.tokens, reference.tokens,
                        "single, seed {seed}, k {k}, draft {with_draft}"
                    );
                    assert_eq!(
                        b.tokens, reference.tokens,
                        "batched, seed {seed}, k {k}, draft {with_draft}"
                    );
                }
            }
            assert!(cache.sequences() > 0, "finished requests were published");
        }
    }
}

#[test]
fn coupled_suffix_decoding_at_temperature_one_equals_target_only_coupled_decoding() {
    let cache = SuffixCache::new(10_000).unwrap();
    let mut drafted = 0;
    for seed in 0..12u64 {
        for with_draft in [false, true] {
            let mut e = engine(3, with_draft);
            e.set_suffix_cache(Some(Arc::clone(&cache)));
            for p in prompts() {
                let coupled = |cfg: GenerationConfig| GenerationConfig {
                    seed,
                    coupled: true,
                    ..cfg
                };
                let reference = engine(3, false)
                    .generate(&p, coupled(plain(24, t1())), |_| true)
                    .unwrap();
                let out = e
                    .generate(&p, coupled(suffix(4, 24, with_draft, t1())), |_| true)
                    .unwrap();
                assert_eq!(
                    out.tokens, reference.tokens,
                    "seed {seed}, draft {with_draft}, prompt {p:?}"
                );
                drafted += out.stats.n_drafted_ngram;
            }
        }
    }
    assert!(
        drafted > 0,
        "suffix decoding never drafted: the test would prove nothing"
    );
}

#[test]
fn a_shared_cache_drafts_a_repeated_request_from_the_earlier_output() {
    // A prompt with no repeats of its own: without a cache suffix decoding has nothing to draft from its prompt; with
    // one, the second identical request drafts the first one's output (the mock target is deterministic at T = 0).
    let prompt: Vec<u32> = (10..30).collect();
    let cfg = suffix(8, 48, false, greedy());
    let reference = engine(9, false)
        .generate(&prompt, plain(48, greedy()), |_| true)
        .unwrap();
    for shared in [false, true] {
        let cache = shared.then(|| SuffixCache::new(10_000).unwrap());
        let mut e = engine(9, false);
        e.set_suffix_cache(cache.clone());
        let first = e.generate(&prompt, cfg.clone(), |_| true).unwrap();
        let second = e.generate(&prompt, cfg.clone(), |_| true).unwrap();
        assert_eq!(first.tokens, reference.tokens);
        assert_eq!(second.tokens, reference.tokens);
        let (a1, a2) = (first.stats.n_accepted_ngram, second.stats.n_accepted_ngram);
        eprintln!(
            "shared {shared}: accepted {a1} then {a2}; rounds {} then {}",
            first.stats.n_rounds, second.stats.n_rounds
        );
        if shared {
            // all but the first few positions come from the earlier request's output
            assert!(
                a2 >= 40,
                "second request accepted only {a2} of 48 from the cache ({a1} the first time)"
            );
            assert!(
                second.stats.n_rounds < first.stats.n_rounds / 2,
                "{:?}",
                second.stats
            );
        } else {
            assert!(
                a2 <= a1 + 4,
                "without a cache the second request should draft as the first: {a1} / {a2}"
            );
        }
    }
    // the batched engine publishes rows as they leave: a later batch drafts from them
    let cache = SuffixCache::new(10_000).unwrap();
    let mut b = batch_engine(9, false, 2);
    b.set_suffix_cache(Some(Arc::clone(&cache)));
    let first = run_batch(&mut b, &[(prompt.clone(), cfg.clone())]);
    let second = run_batch(&mut b, &[(prompt.clone(), cfg)]);
    assert_eq!(first[0].tokens, reference.tokens);
    assert_eq!(second[0].tokens, reference.tokens);
    assert!(
        second[0].stats.n_accepted_ngram >= 40,
        "{:?}",
        second[0].stats
    );
    assert_eq!(cache.sequences(), 2);
}
