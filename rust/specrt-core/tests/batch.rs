//! Batched rounds over mock models: every row of a mixed batch (rows accepting 0 and K in the same round, different
//! K, prompt lengths and sampling settings, a stop inside a block, rows joining mid-flight, a cancelled row, a stop
//! string cut) gives exactly its solo output: greedy, seeded temperature 1 with fixed K, and coupled sampling with
//! auto K (whose choice of K depends on the batch).

mod common;

use specrt_core::testing::{MockBatchModel, MockModel};
use specrt_core::{
    AutoK, Backend, BatchBackend, BatchEngine, BatchOptions, Engine, FinishReason,
    GenerationConfig, GenerationOutput, NgramConfig, SamplingParams, SpecError, TokenSource,
};

const VOCAB: usize = 64;
const MAX_SEQ: usize = 256;

fn target() -> MockModel {
    MockModel::new(VOCAB, MAX_SEQ, 7, 4.0)
}

fn draft(noise: f32) -> MockModel {
    target().with_noise(1007, noise)
}

fn solo(prompt: &[u32], cfg: &GenerationConfig, noise: f32) -> GenerationOutput {
    let mut e = Engine::new(
        Box::new(target()),
        Some(Box::new(draft(noise)) as Box<dyn Backend>),
    )
    .unwrap();
    e.generate(prompt, cfg.clone(), |_| true).unwrap()
}

fn engine(max_batch: usize, noise: f32, prefill_chunk: usize) -> BatchEngine {
    BatchEngine::new(
        Box::new(MockBatchModel::new(&target(), max_batch)),
        Some(Box::new(MockBatchModel::new(&draft(noise), max_batch)) as Box<dyn BatchBackend>),
        BatchOptions {
            prefill_chunk,
            ..BatchOptions::default()
        },
    )
    .unwrap()
}

/// `max_batch` slots prefilling in chunks of `prefill_chunk`, at most `max_prefill_tokens` a round.
fn budget_engine(
    max_batch: usize,
    noise: f32,
    prefill_chunk: usize,
    max_prefill_tokens: usize,
) -> BatchEngine {
    BatchEngine::new(
        Box::new(MockBatchModel::new(&target(), max_batch)),
        Some(Box::new(MockBatchModel::new(&draft(noise), max_batch)) as Box<dyn BatchBackend>),
        BatchOptions {
            prefill_chunk,
            max_prefill_tokens,
            ..BatchOptions::default()
        },
    )
    .unwrap()
}

/// `max_batch` slots, the batch's K controllers set by `auto_k`.
fn auto_engine(max_batch: usize, noise: f32, auto_k: &AutoK) -> BatchEngine {
    BatchEngine::new(
        Box::new(MockBatchModel::new(&target(), max_batch)),
        Some(Box::new(MockBatchModel::new(&draft(noise), max_batch)) as Box<dyn BatchBackend>),
        BatchOptions {
            auto_k: auto_k.clone(),
            ..BatchOptions::default()
        },
    )
    .unwrap()
}

/// An `auto_engine` with K up to 4, and greedy auto-K requests of a given `max_new_tokens` for it.
fn greedy_auto_k4(
    max_batch: usize,
    noise: f32,
) -> (BatchEngine, impl Fn(usize) -> GenerationConfig) {
    let auto_k = AutoK {
        k_max: 4,
        ..AutoK::default()
    };
    let e = auto_engine(max_batch, noise, &auto_k);
    let cfg = move |n: usize| GenerationConfig {
        sampling: SamplingParams::greedy(),
        max_new_tokens: n,
        auto_k: Some(auto_k.clone()),
        ..GenerationConfig::default()
    };
    (e, cfg)
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 17 + seed * 5 + 3) % VOCAB as u32)
        .collect()
}

/// A mix of settings: K 0..8, n-gram, penalties, a stop token, short and long prompts and budgets.
fn requests(sampling: SamplingParams) -> Vec<(Vec<u32>, GenerationConfig)> {
    let base = GenerationConfig {
        sampling,
        ..GenerationConfig::default()
    };
    vec![
        (
            prompt(1, 9),
            GenerationConfig {
                num_speculative_tokens: 4,
                max_new_tokens: 40,
                seed: 1,
                top_logprobs: 3, // one row with alternatives: they follow its rows in the batch too
                prompt_logprobs: Some(2), // and scores its prompt in its prefill chunks
                ..base.clone()
            },
        ),
        (
            prompt(2, 1),
            GenerationConfig {
                num_speculative_tokens: 2,
                max_new_tokens: 23,
                seed: 2,
                ..base.clone()
            },
        ),
        (
            prompt(3, 17),
            GenerationConfig {
                num_speculative_tokens: 8,
                max_new_tokens: 31,
                seed: 3,
                ..base.clone()
            },
        ),
        (
            prompt(4, 5),
            GenerationConfig {
                num_speculative_tokens: 0,
                max_new_tokens: 12,
                seed: 4,
                ..base.clone()
            },
        ),
        (
            prompt(5, 12),
            GenerationConfig {
                num_speculative_tokens: 3,
                max_new_tokens: 35,
                seed: 5,
                ngram: Some(NgramConfig {
                    prompt_lookup_min: 1,
                    prompt_lookup_max: 3,
                    method: specrt_core::LookupMethod::PromptLookup,
                }),
                ..base.clone()
            },
        ),
        (
            prompt(6, 7),
            GenerationConfig {
                num_speculative_tokens: 5,
                max_new_tokens: 30,
                seed: 6,
                sampling: SamplingParams {
                    repetition_penalty: 1.3,
                    ..sampling
                },
                ..base.clone()
            },
        ),
        (
            prompt(7, 3),
            GenerationConfig {
                num_speculative_tokens: 6,
                max_new_tokens: 50,
                seed: 7,
                ..base
            },
        ),
    ]
}

/// Run all requests through a batch of `max_batch` rows (more requests than rows: the rest join mid-flight);
/// returns each output and, per round, each row's (drafted, accepted).
fn run_batched(
    e: &mut BatchEngine,
    reqs: &[(Vec<u32>, GenerationConfig)],
) -> (Vec<GenerationOutput>, Vec<Vec<(usize, usize)>>) {
    for (i, (p, c)) in reqs.iter().enumerate() {
        e.add(i as u64, p, c.clone()).unwrap();
    }
    let mut rounds = Vec::new();
    let mut streamed: Vec<Vec<u32>> = vec![Vec::new(); reqs.len()];
    let mut guard = 0;
    while !e.is_idle() {
        let steps = e.step().unwrap();
        let mut round = Vec::new();
        for s in steps {
            assert!(s.error.is_none(), "{:?}", s.error);
            streamed[s.id as usize].extend_from_slice(&s.out.tokens);
            let acc = s
                .out
                .sources
                .iter()
                .filter(|x| **x == TokenSource::Accepted)
                .count();
            round.push((s.out.n_drafted, acc));
        }
        rounds.push(round);
        guard += 1;
        assert!(guard < 10_000, "the batch never drained");
    }
    let outs: Vec<GenerationOutput> = (0..reqs.len())
        .map(|i| e.take_output(i as u64).expect("finished"))
        .collect();
    for (o, s) in outs.iter().zip(&streamed) {
        assert_eq!(&o.tokens, s, "streamed tokens = final tokens");
    }
    (outs, rounds)
}

fn assert_same(batched: &GenerationOutput, solo: &GenerationOutput, what: &str) {
    common::assert_same_tokens(batched, solo, what);
    let (b, s) = (&batched.stats, &solo.stats);
    assert_eq!(
        (
            b.n_rounds,
            b.n_drafted,
            b.n_accepted,
            b.n_recovered,
            b.n_bonus,
            &b.rounds_by_k
        ),
        (
            s.n_rounds,
            s.n_drafted,
            s.n_accepted,
            s.n_recovered,
            s.n_bonus,
            &s.rounds_by_k
        ),
        "{what}: statistics"
    );
}

#[test]
fn mixed_greedy_batch_equals_solo_runs() {
    let noise = 0.6;
    let reqs = requests(SamplingParams::greedy());
    let mut e = engine(3, noise, 4);
    let (outs, rounds) = run_batched(&mut e, &reqs);
    for (i, ((p, c), o)) in reqs.iter().zip(&outs).enumerate() {
        assert_same(o, &solo(p, c, noise), &format!("request {i}"));
    }
    // The batch really was mixed: a round where one row accepted none of its drafts and another all of them.
    let mixed = rounds.iter().any(|r| {
        r.iter().any(|&(k, a)| k > 0 && a == 0) && r.iter().any(|&(k, a)| k > 0 && a == k)
    });
    assert!(mixed, "no round mixed 0 and K accepted: {rounds:?}");
    // Rows with different K in one round.
    assert!(rounds.iter().any(|r| {
        let ks: Vec<usize> = r.iter().map(|x| x.0).filter(|&k| k > 0).collect();
        ks.iter().any(|&k| k != ks[0])
    }));
}

#[test]
fn seeded_temperature_one_batch_equals_solo_runs_with_fixed_k() {
    let noise = 0.8;
    let sampling = SamplingParams {
        temperature: 1.0,
        top_p: 0.95,
        ..SamplingParams::default()
    };
    let reqs = requests(sampling);
    for max_batch in [1, 2, 4, 8] {
        let mut e = engine(max_batch, noise, 5);
        let (outs, _) = run_batched(&mut e, &reqs);
        for (i, ((p, c), o)) in reqs.iter().zip(&outs).enumerate() {
            assert_same(
                o,
                &solo(p, c, noise),
                &format!("B {max_batch}, request {i}"),
            );
        }
    }
}

#[test]
fn a_stop_token_inside_a_block_ends_only_that_row() {
    // The draft equals the target (every draft accepted): find a token the first request emits mid-block and make
    // it a stop token.
    let reqs = requests(SamplingParams::greedy());
    let (p, c) = &reqs[0];
    let free = solo(p, c, 0.0);
    let stop = free.tokens[6];
    let mut reqs2 = reqs.clone();
    reqs2[0].1.stop_token_ids = vec![stop];
    let mut e = engine(4, 0.0, 64);
    let (outs, _) = run_batched(&mut e, &reqs2);
    for (i, ((p, c), o)) in reqs2.iter().zip(&outs).enumerate() {
        assert_same(o, &solo(p, c, 0.0), &format!("request {i}"));
    }
    assert_eq!(outs[0].finish_reason, FinishReason::Stop);
    assert!(outs[0].tokens.len() <= 7);
}

#[test]
fn coupled_rows_with_auto_k_equal_coupled_target_only() {
    // Coupled sampling: each row's tokens are fixed by its seed whatever K the batch chooses.
    let sampling = SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    };
    let reqs: Vec<(Vec<u32>, GenerationConfig)> = requests(sampling)
        .into_iter()
        .map(|(p, c)| {
            (
                p,
                GenerationConfig {
                    coupled: true,
                    ngram: None,
                    auto_k: Some(AutoK::default()),
                    ..c
                },
            )
        })
        .collect();
    let mut e = engine(3, 0.5, 6);
    let (outs, _) = run_batched(&mut e, &reqs);
    for (i, ((p, c), o)) in reqs.iter().zip(&outs).enumerate() {
        let plain = GenerationConfig {
            auto_k: None,
            num_speculative_tokens: 0,
            ..c.clone()
        };
        let reference = solo(p, &plain, 0.5);
        assert_eq!(o.tokens, reference.tokens, "request {i}");
    }
    assert!(e.controller(3).is_some(), "auto K rows ran at batch size 3");
}

#[test]
fn cancel_and_stop_at_leave_the_other_rows_exact() {
    let noise = 0.6;
    let reqs = requests(SamplingParams::greedy());
    let mut e = engine(3, noise, 4);
    for (i, (p, c)) in reqs.iter().enumerate() {
        e.add(i as u64, p, c.clone()).unwrap();
    }
    let mut rounds = 0;
    while !e.is_idle() {
        e.step().unwrap();
        rounds += 1;
        if rounds == 3 {
            assert!(e.cancel(1).unwrap(), "request 1 was running or waiting");
            assert!(!e.cancel(99).unwrap());
        }
        if rounds == 4 {
            let n = e.stats(0).map(|s| s.n_emitted() as usize).unwrap();
            if n > 2 {
                e.stop_at(0, n - 2).unwrap();
            }
        }
    }
    assert!(
        e.take_output(1).is_none(),
        "a cancelled request has no output"
    );
    let first = e.take_output(0).unwrap();
    let full = solo(&reqs[0].0, &reqs[0].1, noise);
    assert_eq!(first.finish_reason, FinishReason::Stop);
    assert_eq!(first.tokens[..], full.tokens[..first.tokens.len()]);
    for (i, (p, c)) in reqs.iter().enumerate().skip(2) {
        let o = e.take_output(i as u64).unwrap();
        assert_same(&o, &solo(p, c, noise), &format!("request {i}"));
    }
}

#[test]
fn bad_requests_are_refused_by_name() {
    let mut e = engine(2, 0.5, 8);
    let cfg = GenerationConfig::default();
    e.add(1, &[1, 2], cfg.clone()).unwrap();
    let dup = e.add(1, &[1, 2], cfg.clone()).unwrap_err();
    assert!(
        matches!(dup, SpecError::Config(ref m) if m.contains("id 1")),
        "{dup}"
    );
    let empty = e.add(2, &[], cfg.clone()).unwrap_err();
    assert_eq!(empty.field(), Some("prompt"), "{empty}");
    let oov = e.add(3, &[1, VOCAB as u32], cfg.clone()).unwrap_err();
    assert!(
        matches!(oov, SpecError::Vocab(ref m) if m.contains("64")),
        "{oov}"
    );
    let long = e
        .add(
            4,
            &[1; 10],
            GenerationConfig {
                max_new_tokens: MAX_SEQ,
                ..cfg
            },
        )
        .unwrap_err();
    assert!(matches!(long, SpecError::Length(_)), "{long}");
    let bad = BatchEngine::new(
        Box::new(MockBatchModel::new(&target(), 2)),
        None,
        BatchOptions {
            prefill_chunk: 0,
            ..BatchOptions::default()
        },
    );
    assert!(
        matches!(bad, Err(SpecError::Setting { ref field, ref message }) if field == "prefill_chunk" && message.contains("prefill_chunk"))
    );
    let bad = BatchOptions {
        max_prefill_tokens: 0,
        ..BatchOptions::default()
    }
    .validate();
    assert!(
        matches!(bad, Err(SpecError::Setting { ref field, ref message }) if field == "max_prefill_tokens" && message == "max_prefill_tokens 0 is invalid (expected an integer >= 1)"),
        "{bad:?}"
    );
}

/// The round (1-based) of each request's first emitted token when `prompts` all arrive before the first round.
fn first_token_rounds(e: &mut BatchEngine, prompts: &[Vec<u32>]) -> Vec<usize> {
    let cfg = GenerationConfig {
        sampling: SamplingParams::greedy(),
        num_speculative_tokens: 3,
        max_new_tokens: 4,
        ..GenerationConfig::default()
    };
    for (i, p) in prompts.iter().enumerate() {
        e.add(i as u64, p, cfg.clone()).unwrap();
    }
    let mut first = vec![0; prompts.len()];
    let mut round = 0;
    while !e.is_idle() {
        round += 1;
        for s in e.step().unwrap() {
            let f = &mut first[s.id as usize];
            if *f == 0 && !s.out.tokens.is_empty() {
                *f = round;
            }
        }
        assert!(round < 1000, "the batch never drained");
    }
    first
}

#[test]
fn a_round_prefills_whole_chunks_of_several_joining_prompts_up_to_max_prefill_tokens() {
    // Three prompts of 8 tokens (2 chunks of 4 each) arrive together. A step whose prefill ends a prompt returns
    // its first token at once and runs its round in the next step (which prefills nothing).
    let prompts: Vec<Vec<u32>> = (1..=3).map(|s| prompt(s, 8)).collect();
    // (max_prefill_tokens, the step of each row's first token)
    let cases: [(usize, [usize; 3]); 6] = [
        (4, [2, 5, 8]), // one chunk a step: row 0's second chunk in step 2, step 3 its round, row 1 from step 4
        (1, [2, 5, 8]), // a budget below a chunk still prefills one
        (8, [1, 3, 5]), // one whole prompt a step (a row's next chunk before the next row's)
        (7, [2, 5, 8]), // 7 tokens hold one chunk: as 4
        (12, [1, 3, 3]), // prompt 0 and half of prompt 1 in step 1, the rest of 1 and all of 2 in step 3
        (1024, [1, 1, 1]), // everything in the first step
    ];
    for (budget, want) in cases {
        let got = first_token_rounds(&mut budget_engine(3, 0.5, 4, budget), &prompts);
        assert_eq!(got, want, "max_prefill_tokens {budget}");
    }
    // A shorter prompt behind one whose chunk no longer fits takes the budget's rest.
    let mixed = vec![prompt(1, 8), prompt(2, 8), prompt(3, 2)];
    assert_eq!(
        first_token_rounds(&mut budget_engine(3, 0.5, 4, 10), &mixed),
        [1, 3, 1]
    );
}

#[test]
fn outputs_do_not_depend_on_max_prefill_tokens() {
    // The mixed batch (more requests than rows: some join mid-flight while others decode) with one chunk a round
    // and with every joining prompt in one round: each request's output equals its solo run either way.
    let noise = 0.7;
    for sampling in [
        SamplingParams::greedy(),
        SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        },
    ] {
        let reqs = requests(sampling);
        let (one, rounds_one) = run_batched(&mut budget_engine(3, noise, 4, 4), &reqs);
        let (all, rounds_all) = run_batched(&mut budget_engine(3, noise, 4, 4096), &reqs);
        for (i, ((p, c), (a, b))) in reqs.iter().zip(one.iter().zip(&all)).enumerate() {
            let want = solo(p, c, noise);
            assert_same(a, &want, &format!("request {i}, one chunk a round"));
            assert_same(b, &want, &format!("request {i}, max_prefill_tokens 4096"));
        }
        assert!(
            rounds_all.len() < rounds_one.len(),
            "the budget changed nothing: {} vs {} rounds",
            rounds_all.len(),
            rounds_one.len()
        );
    }
}

#[test]
fn a_joining_prefill_holds_the_batch_back_by_one_chunk() {
    // While a long prompt prefills in chunks of 4 (one a step), the running row still commits tokens every round.
    let mut e = budget_engine(2, 0.3, 4, 4);
    let cfg = GenerationConfig {
        sampling: SamplingParams::greedy(),
        max_new_tokens: 30,
        ..GenerationConfig::default()
    };
    let has = |steps: &[specrt_core::RowStep], id: u64| {
        steps.iter().any(|s| s.id == id && !s.out.tokens.is_empty())
    };
    e.add(0, &prompt(1, 3), cfg.clone()).unwrap();
    assert!(
        has(e.step().unwrap(), 0),
        "the prefill's step gives row 0 its first token"
    );
    e.add(1, &prompt(2, 40), cfg).unwrap(); // 10 chunks
                                            // The round due first (nothing prefilled), then 9 chunks, each step with a round.
    for _ in 0..10 {
        let steps = e.step().unwrap();
        assert!(has(steps, 0) && !has(steps, 1));
    }
    let steps = e.step().unwrap();
    assert!(
        has(steps, 1) && !has(steps, 0),
        "row 1's 10th chunk gives its first token, before the round"
    );
    let steps = e.step().unwrap();
    assert!(has(steps, 0) && has(steps, 1), "then both decode");
}

#[test]
fn auto_rows_take_the_batch_cost_model_and_stop_speculating_when_it_does_not_pay() {
    use specrt_core::PinnedCosts;
    let run = |c_verify: Vec<f64>| -> Vec<u64> {
        let auto_k = AutoK {
            k_max: 4,
            pinned: Some(PinnedCosts {
                c_draft: 1.0,
                c_verify,
            }),
            ..AutoK::default()
        };
        // A draft equal to the target: every draft accepted, so only the costs decide.
        let mut e = auto_engine(2, 0.0, &auto_k);
        let cfg = GenerationConfig {
            sampling: SamplingParams::greedy(),
            max_new_tokens: 40,
            auto_k: Some(auto_k),
            ..GenerationConfig::default()
        };
        e.add(0, &prompt(1, 4), cfg.clone()).unwrap();
        e.add(1, &prompt(2, 6), cfg).unwrap();
        while !e.is_idle() {
            e.step().unwrap();
        }
        e.take_output(0).unwrap().stats.rounds_by_k
    };
    // Flat verification (bandwidth-bound): drafting pays, K = 4 in every round but the last.
    // (The prefill's token counts as a round with K = 0.)
    let flat = run(vec![10.0; 5]);
    assert!(flat[4] + 2 >= flat.iter().sum::<u64>(), "{flat:?}");
    // Verification cost growing with every token (a compute-bound batch; E(K) / cost(K) < 1 / c_verify(1) even at
    // full acceptance): plain rounds, drafting only to probe.
    let steep = run((1..=5).map(|n| 10.0 * f64::from(n)).collect());
    assert!(steep[0] * 2 > steep.iter().sum::<u64>(), "{steep:?}");
}

#[test]
fn a_batch_that_shrinks_keeps_its_target_costs_instead_of_timing_plain_passes_again() {
    // Two auto-K rows; the short one finishes and the batch goes from 2 slots to 1. The size-1 controller starts
    // from size 2's confirmed target costs, so its first round needs no plain pass to time one.
    let (mut e, cfg) = greedy_auto_k4(2, 0.3);
    e.add(0, &prompt(1, 4), cfg(12)).unwrap();
    e.add(1, &prompt(2, 6), cfg(120)).unwrap();
    while e.take_output(0).is_none() {
        e.step().unwrap();
    }
    assert!(
        e.controller(2).unwrap().verify_cost_known(1),
        "size 2 timed its plain pass"
    );
    assert!(e.controller(1).is_none());
    e.step().unwrap(); // the first round at size 1
    let c = e.controller(1).expect("size 1 ran a round");
    assert!(
        c.verify_cost_known(1),
        "inherited from size 2, or re-timed by this round"
    );
    while !e.is_idle() {
        e.step().unwrap();
    }
    let solo_out = solo(&prompt(2, 6), &cfg(120), 0.3);
    assert_eq!(e.take_output(1).unwrap().tokens, solo_out.tokens);
}

#[test]
fn a_size_between_a_smaller_and_a_larger_one_inherits_from_the_larger() {
    // One request alone (size 1), three join (size 4), then they finish one by one (sizes 3 and 2). Size 2 is as near
    // to size 1 as to size 3 and takes size 3's costs: no plain rounds there. A draft equal to the target accepts
    // every draft, so all rows gain K + 1 tokens a round and finish in the order of their budgets.
    let (mut e, cfg) = greedy_auto_k4(4, 0.0);
    e.add(0, &prompt(1, 4), cfg(200)).unwrap();
    for _ in 0..4 {
        e.step().unwrap();
    }
    for (id, n) in [(1, 4), (2, 40), (3, 120)] {
        e.add(id, &prompt(id as u32 + 1, 5), cfg(n)).unwrap();
    }
    while e.take_output(2).is_none() {
        e.step().unwrap();
    }
    assert!(e.take_output(1).is_some() && e.controller(3).is_some());
    assert!(e.controller(2).is_none());
    e.step().unwrap(); // the first round at size 2
    assert!(
        e.controller(2).unwrap().verify_cost_known(1),
        "size 2 took size 3's costs, not size 1's estimates alone"
    );
}

#[test]
fn a_stop_string_found_in_the_last_round_cuts_a_finished_row() {
    // The caller finds a stop string in the text of the round that finished the row (by length): the row has left
    // the batch, and stop_at still cuts it back, as the solo engine does.
    let reqs = requests(SamplingParams::greedy());
    let (p, c) = &reqs[3]; // K = 0, 12 tokens: one token per round
    let mut e = engine(2, 0.5, 8);
    e.add(7, p, c.clone()).unwrap();
    let mut n = 0;
    loop {
        let done = e
            .step()
            .unwrap()
            .iter()
            .any(|s| s.out.finish_reason.is_some());
        n += 1;
        if done {
            break;
        }
        assert!(n < 100);
    }
    assert_eq!(e.n_running(), 0);
    e.stop_at(7, 5).unwrap();
    let out = e.take_output(7).unwrap();
    let full = solo(p, c, 0.5);
    assert_eq!(out.tokens, full.tokens[..5]);
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(out.stats.n_emitted(), 5);
    let err = e.stop_at(8, 1).unwrap_err();
    assert!(
        matches!(err, SpecError::Config(ref m) if m.contains("id 8")),
        "{err}"
    );
}
