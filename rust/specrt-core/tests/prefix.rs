//! Prefix caching in the single-stream engine over mock models whose logits depend on the whole prefix (a cache
//! reused for other tokens than the engine believes changes every later row): a run of requests through one engine
//! with prefix caching gives exactly what a fresh engine gives each request (tokens, sources, log-probabilities,
//! draft statistics), for greedy, seeded and coupled sampling, with a draft model, with prompt lookup and with
//! requests that leave the draft idle; the reused lengths are the longest common prefixes, and only the rest of a
//! prompt is fed.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use specrt_core::testing::MockModel;
use specrt_core::{
    common_prefix_len, AutoK, Backend, Engine, GenerationConfig, GenerationOutput, NgramConfig,
    PinnedCosts, SamplingParams, Stats,
};

const VOCAB: usize = 64;
const MAX_SEQ: usize = 512;

fn target() -> MockModel {
    MockModel::new(VOCAB, MAX_SEQ, 11, 4.0).with_full_context()
}

fn draft() -> MockModel {
    target().with_noise(1011, 0.4)
}

fn engine(with_draft: bool) -> Engine {
    let d = with_draft.then(|| Box::new(draft()) as Box<dyn Backend>);
    Engine::new(Box::new(target()), d).unwrap()
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 29 + seed * 7 + 5) % VOCAB as u32)
        .collect()
}

/// Statistics without timings and without the prefix-cache counters (what must not depend on caching).
fn comparable(s: &Stats) -> Stats {
    Stats {
        n_cached_tokens: 0,
        n_cached_tokens_dft: 0,
        prefill_ms: 0.0,
        draft_ms: 0.0,
        target_ms: 0.0,
        core_ms: 0.0,
        ..s.clone()
    }
}

fn assert_same(cached: &GenerationOutput, fresh: &GenerationOutput, what: &str) {
    common::assert_same_tokens(cached, fresh, what);
    assert_eq!(
        comparable(&cached.stats),
        comparable(&fresh.stats),
        "{what}: statistics"
    );
}

/// The prompts of a session, each built from the previous request's prompt and output: the same prompt twice, a
/// prefix of the cached one, one that diverges mid-way, a chat continuation longer than anything cached, and a
/// continuation whose "re-tokenized" answer differs from the generated ids in one place.
fn next_prompt(i: usize, prev: &[u32]) -> Vec<u32> {
    let base = prompt(1, 30);
    match i {
        0 | 1 => base,
        2 => base[..15].to_vec(),
        3 => {
            let mut p = base[..20].to_vec();
            p.extend(prompt(9, 12));
            p
        }
        4 => {
            let mut p = prev.to_vec();
            p.extend(prompt(4, 40));
            p
        }
        _ => {
            let mut p = prev.to_vec();
            let at = prev.len() - 10;
            p[at] = (p[at] + 1) % VOCAB as u32;
            p.extend(prompt(5, 7));
            p
        }
    }
}

/// Run the session with `cfg_of(i)` for request i through one engine with prefix caching and through a fresh
/// engine per request; check the outputs are equal and the reused lengths are the longest common prefixes. Returns
/// the prefix-cache hits (requests 1-5 reuse something unless they score their prompt).
fn check_session(with_draft: bool, cfg_of: impl Fn(usize) -> GenerationConfig) -> usize {
    let mut e = engine(with_draft);
    assert!(e.prefix_caching(), "on by default");
    // The previous request's committed sequence (prompt + output).
    let mut prev: Vec<u32> = Vec::new();
    let mut hits = 0;
    for i in 0..6 {
        let p = next_prompt(i, &prev);
        let cfg = cfg_of(i);
        let cached = e.generate(&p, cfg.clone(), |_| true).unwrap();
        let fresh = engine(with_draft)
            .generate(&p, cfg.clone(), |_| true)
            .unwrap();
        assert_same(&cached, &fresh, &format!("request {i}"));
        assert_eq!(fresh.stats.n_cached_tokens, 0);
        // The target's KV covers the previous sequence but its last token (or all of it, after a block cut by a
        // stop), never the new prompt's last token.
        let lcp = common_prefix_len(&prev, &p).min(p.len() - 1);
        let got = cached.stats.n_cached_tokens as usize;
        if cfg.prompt_logprobs.is_some() {
            assert_eq!(got, 0, "request {i}: a scored prompt reuses no target KV");
        } else {
            let lo = lcp.min(prev.len().saturating_sub(1));
            assert!(
                (lo..=lcp).contains(&got),
                "request {i}: reused {got}, expected {lo}..={lcp}"
            );
        }
        hits += usize::from(cached.stats.prefix_cache_hit());
        prev = p;
        prev.extend(&cached.tokens);
    }
    hits
}

fn greedy(k: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: 24,
        num_speculative_tokens: k,
        sampling: SamplingParams::greedy(),
        ..GenerationConfig::default()
    }
}

fn sampled(k: usize, seed: u64, coupled: bool) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: 24,
        num_speculative_tokens: k,
        sampling: SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        },
        seed,
        coupled,
        ..GenerationConfig::default()
    }
}

fn ngram() -> Option<NgramConfig> {
    Some(NgramConfig {
        prompt_lookup_min: 1,
        prompt_lookup_max: 3,
        method: specrt_core::LookupMethod::PromptLookup,
    })
}

#[test]
fn greedy_outputs_with_prefix_caching_equal_fresh_prefills() {
    assert_eq!(check_session(true, |_| greedy(4)), 5);
    assert_eq!(check_session(false, |_| greedy(0)), 5);
}

#[test]
fn seeded_sampling_with_a_draft_equals_fresh_prefills_so_the_draft_cache_is_reused_exactly() {
    // Temperature 1, not coupled: the output depends on every draft proposal, so a draft cache reused for other
    // tokens would change it.
    assert_eq!(check_session(true, |i| sampled(3, i as u64, false)), 5);
}

#[test]
fn coupled_sampling_equals_fresh_prefills() {
    assert_eq!(check_session(true, |i| sampled(4, 7 + i as u64, true)), 5);
    // Auto K with pinned costs (measured ones would make K, and so the statistics, differ between runs).
    let hits = check_session(true, |i| GenerationConfig {
        auto_k: Some(AutoK {
            k_max: 4,
            pinned: Some(PinnedCosts {
                c_draft: 1.0,
                c_verify: vec![10.0, 10.5, 11.0, 11.5, 12.0],
            }),
            ..AutoK::default()
        }),
        ..sampled(4, 3 + i as u64, true)
    });
    assert_eq!(hits, 5);
}

#[test]
fn prompt_lookup_and_requests_that_leave_the_draft_idle_equal_fresh_prefills() {
    // Request kinds alternate: n-gram only (the draft sits idle and keeps what it held), n-gram with the draft,
    // K = 0, and the draft alone: a later drafting request reuses the draft KV of an earlier one.
    let hits = check_session(true, |i| match i % 4 {
        0 => GenerationConfig {
            ngram: ngram(),
            use_draft_model: false,
            ..sampled(3, 1, false)
        },
        1 => GenerationConfig {
            ngram: ngram(),
            ..sampled(3, 2, false)
        },
        2 => sampled(0, 3, false),
        _ => sampled(3, 4, false),
    });
    assert_eq!(hits, 5);
    let hits = check_session(false, |_| GenerationConfig {
        ngram: ngram(),
        ..greedy(4)
    });
    assert_eq!(hits, 5);
}

#[test]
fn a_scored_prompt_is_prefilled_in_full_and_its_scores_equal_a_fresh_prefill() {
    // Requests 1, 3 and 5 score their prompts (no target reuse); 2 and 4 reuse.
    let hits = check_session(true, |i| GenerationConfig {
        prompt_logprobs: (i % 2 == 1).then_some(2),
        top_logprobs: 2,
        ..sampled(3, 5, false)
    });
    assert_eq!(hits, 2);
}

#[test]
fn only_the_uncached_rest_of_a_prompt_is_fed_and_the_switch_turns_reuse_off() {
    let fed_tgt = Arc::new(AtomicUsize::new(0));
    let fed_dft = Arc::new(AtomicUsize::new(0));
    let t = target().with_counter(fed_tgt.clone());
    let d = draft().with_counter(fed_dft.clone());
    let mut e = Engine::new(Box::new(t), Some(Box::new(d))).unwrap();
    let p = prompt(2, 50);
    let cfg = greedy(3);
    let first = e.generate(&p, cfg.clone(), |_| true).unwrap();
    // The next turn: the whole history and 20 new tokens.
    let mut p2 = p.clone();
    p2.extend(&first.tokens);
    p2.extend(prompt(3, 20));
    let (t0, d0) = (
        fed_tgt.load(Ordering::Relaxed),
        fed_dft.load(Ordering::Relaxed),
    );
    e.start(&p2, cfg.clone()).unwrap();
    let s = e.stats().unwrap().clone();
    // The target reads the whole uncached rest (the last prompt token too: its row gives the first token); the
    // draft reads nothing yet (its first drafting pass reads its uncached rest).
    let n_prefilled = p2.len() - s.n_cached_tokens as usize;
    assert!(s.n_cached_tokens as usize >= p.len() + first.tokens.len() - 1);
    assert_eq!(fed_tgt.load(Ordering::Relaxed) - t0, n_prefilled);
    assert_eq!(fed_dft.load(Ordering::Relaxed) - d0, 0);
    e.step().unwrap();
    e.step().unwrap();
    assert_eq!(
        fed_dft.load(Ordering::Relaxed) - d0,
        p2.len() + 1 - s.n_cached_tokens_dft as usize + 2,
        "the first drafting round's first pass reads the uncached prompt and the first token, then a token a pass"
    );
    // A request refused before it runs leaves the caches as they were: the next one still reuses them.
    let bad = GenerationConfig {
        max_new_tokens: 0,
        ..cfg.clone()
    };
    assert!(e.start(&p2, bad).is_err());
    e.start(&p2, cfg.clone()).unwrap();
    assert_eq!(e.stats().unwrap().n_cached_tokens as usize, p2.len() - 1);
    // Off: the whole prompt is prefilled again.
    e.set_prefix_caching(false);
    assert!(!e.prefix_caching());
    let t1 = fed_tgt.load(Ordering::Relaxed);
    e.start(&p2, cfg.clone()).unwrap();
    assert_eq!(e.stats().unwrap().n_cached_tokens, 0);
    assert_eq!(fed_tgt.load(Ordering::Relaxed) - t1, p2.len());
    // On again: what the request run while off left in the caches is reused.
    e.set_prefix_caching(true);
    e.start(&p2, cfg).unwrap();
    assert_eq!(e.stats().unwrap().n_cached_tokens as usize, p2.len() - 1);
}

// ---- The batched engine: kept prefixes in the prefix store, copied in at admission. ----

use specrt_core::testing::MockBatchModel;
use specrt_core::{BatchBackend, BatchEngine, BatchOptions};

fn batch_engine(max_batch: usize, opts: BatchOptions) -> BatchEngine {
    BatchEngine::new(
        Box::new(MockBatchModel::new(&target(), max_batch)),
        Some(Box::new(MockBatchModel::new(&draft(), max_batch)) as Box<dyn BatchBackend>),
        BatchOptions {
            prefill_chunk: 8,
            ..opts
        },
    )
    .unwrap()
}

/// Add `requests` (id, prompt, settings) at once and step until all finished; outputs by id order.
fn run_batch(
    e: &mut BatchEngine,
    requests: &[(u64, Vec<u32>, GenerationConfig)],
) -> Vec<GenerationOutput> {
    for (id, p, cfg) in requests {
        e.add(*id, p, cfg.clone()).unwrap();
    }
    while !e.is_idle() {
        for r in e.step().unwrap() {
            assert!(r.error.is_none(), "row {}: {:?}", r.id, r.error);
        }
    }
    requests
        .iter()
        .map(|(id, _, _)| e.take_output(*id).unwrap())
        .collect()
}

fn solo(p: &[u32], cfg: &GenerationConfig) -> GenerationOutput {
    let mut e = engine(true);
    e.set_prefix_caching(false);
    e.generate(p, cfg.clone(), |_| true).unwrap()
}

/// The session of `check_session`, one request at a time through a batched engine, each output compared with a
/// solo run without prefix caching. Returns the hits.
fn check_batched_session(e: &mut BatchEngine, cfg_of: impl Fn(usize) -> GenerationConfig) -> usize {
    let mut prev: Vec<u32> = Vec::new();
    // Every earlier sequence: the store may keep any of them.
    let mut seen: Vec<Vec<u32>> = Vec::new();
    let mut hits = 0;
    for i in 0..6 {
        let p = next_prompt(i, &prev);
        let cfg = cfg_of(i);
        let out = run_batch(e, &[(i as u64, p.clone(), cfg.clone())]).remove(0);
        assert_same(&out, &solo(&p, &cfg), &format!("batched request {i}"));
        let lcp = seen
            .iter()
            .map(|q| common_prefix_len(q, &p).min(p.len() - 1))
            .max()
            .unwrap_or(0);
        let got = out.stats.n_cached_tokens as usize;
        assert!(got <= lcp, "request {i}: reused {got} > {lcp}");
        hits += usize::from(out.stats.prefix_cache_hit());
        prev = p;
        prev.extend(&out.tokens);
        seen.push(prev.clone());
    }
    hits
}

#[test]
fn batched_outputs_with_prefix_caching_equal_solo_runs() {
    let mut e = batch_engine(2, BatchOptions::default());
    assert_eq!(check_batched_session(&mut e, |_| greedy(4)), 5);
    let mut e = batch_engine(2, BatchOptions::default());
    assert_eq!(
        check_batched_session(&mut e, |i| sampled(3, i as u64, false)),
        5
    );
    let mut e = batch_engine(3, BatchOptions::default());
    assert_eq!(
        check_batched_session(&mut e, |i| sampled(4, i as u64, true)),
        5
    );
    // Prompt lookup, K = 0 and scored prompts between drafting requests.
    let mut e = batch_engine(2, BatchOptions::default());
    let hits = check_batched_session(&mut e, |i| match i % 3 {
        0 => GenerationConfig {
            ngram: ngram(),
            ..sampled(3, 1, false)
        },
        1 => sampled(0, 2, false),
        _ => GenerationConfig {
            prompt_logprobs: Some(1),
            ..sampled(3, 3, false)
        },
    });
    assert!(hits >= 3, "{hits} hits");
}

#[test]
fn concurrent_requests_sharing_a_system_prompt_reuse_it_and_equal_solo_runs() {
    let system = prompt(7, 40);
    let with_question = |q: u32| [&system[..], &prompt(q, 6)[..]].concat();
    let cfg = |i: u64| sampled(3, i, false);
    // Request 0 of the first wave finds nothing kept; its prompt is stored once prefilled, and the requests admitted
    // with it look the store up only at their first prefill chunk, after it: they reuse the system prompt, in the
    // same round when the budget holds request 0's prompt (1024), rounds later with one chunk a round (8). The rows
    // that finish keep it for the second wave.
    for max_prefill_tokens in [8, 1024] {
        let mut e = batch_engine(
            3,
            BatchOptions {
                max_prefill_tokens,
                ..BatchOptions::default()
            },
        );
        let first: Vec<_> = (0..4)
            .map(|i| (i, with_question(i as u32 + 20), cfg(i)))
            .collect();
        let second: Vec<_> = (4..9)
            .map(|i| (i, with_question(i as u32 + 20), cfg(i)))
            .collect();
        for wave in [&first, &second] {
            let outs = run_batch(&mut e, wave);
            for ((id, p, c), out) in wave.iter().zip(&outs) {
                let what = format!("request {id}, max_prefill_tokens {max_prefill_tokens}");
                assert_same(out, &solo(p, c), &what);
                let reused = out.stats.n_cached_tokens as usize;
                if *id == 0 {
                    assert_eq!(reused, 0, "{what}");
                } else {
                    assert!(reused >= system.len(), "{what}: reused {reused}");
                }
            }
        }
        let (n, bytes) = e.prefix_cache_usage();
        assert!(n >= 1 && bytes > 0);
    }
}

#[test]
fn a_tiny_budget_evicts_the_least_recently_used_prefixes_and_outputs_stay_exact() {
    // 1 byte per position per model (the mock's default), so a prefix of n positions in both models costs 2 n.
    let budget = 150;
    let mut e = batch_engine(
        2,
        BatchOptions {
            prefix_cache_bytes: budget,
            ..BatchOptions::default()
        },
    );
    let a = prompt(1, 30);
    let b = prompt(2, 30);
    let c = prompt(3, 30);
    let cfg = GenerationConfig {
        max_new_tokens: 3,
        ..greedy(3)
    };
    let mut run = |id: u64, p: &Vec<u32>| {
        let out = run_batch(&mut e, &[(id, p.clone(), cfg.clone())]).remove(0);
        assert_same(&out, &solo(p, &cfg), &format!("request {id}"));
        let (_, used) = e.prefix_cache_usage();
        assert!(used <= budget, "{used} bytes kept, budget {budget}");
        out.stats.n_cached_tokens
    };
    assert_eq!(run(0, &a), 0);
    assert_eq!(run(1, &b), 0); // a (about 63 bytes: 32 target and 31 draft positions) and b fit
    assert_eq!(run(2, &a), 29); // a used again: b is now the least recently used
    assert_eq!(run(3, &c), 0); // c evicts b
    assert_eq!(run(4, &b), 0, "b was evicted");
    assert!(run(5, &c) > 0, "c is still kept");
    // A prefix larger than the whole budget is not kept, and nothing else is dropped for it.
    let long = prompt(4, 160);
    assert_eq!(run(6, &long), 0);
    assert_eq!(run(7, &long), 0);
    // Budget 0 keeps nothing.
    let mut e = batch_engine(
        2,
        BatchOptions {
            prefix_cache_bytes: 0,
            ..BatchOptions::default()
        },
    );
    assert_eq!(check_batched_session(&mut e, |_| greedy(2)), 0);
    assert_eq!(e.prefix_cache_usage(), (0, 0));
    // Off: nothing is kept either.
    let mut e = batch_engine(
        2,
        BatchOptions {
            prefix_caching: false,
            ..BatchOptions::default()
        },
    );
    assert_eq!(check_batched_session(&mut e, |_| greedy(2)), 0);
    assert_eq!(e.prefix_cache_usage(), (0, 0));
}
