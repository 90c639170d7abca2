//! Properties of one verification round on arbitrary inputs (proptest).

use proptest::prelude::*;
use specrt_core::{verify, PenaltyContext, Rng, Sampler, SamplingParams, Verification, VerifyMode};

#[derive(Debug, Clone)]
struct Round {
    vocab: usize,
    k: usize,
    logits: Vec<f32>,
    draft_logits: Vec<f32>,
    params: SamplingParams,
    mode: VerifyMode,
    seed: u64,
}

fn round() -> impl Strategy<Value = Round> {
    (1usize..40, 0usize..8).prop_flat_map(|(vocab, k)| {
        (
            prop::collection::vec(
                prop_oneof![9 => -20.0f32..20.0, 1 => Just(f32::NEG_INFINITY)],
                (k + 1) * vocab,
            ),
            prop::collection::vec(-20.0f32..20.0, k * vocab),
            (
                0.0f32..2.0,
                0u32..6,
                0.05f32..=1.0,
                0.0f32..0.5,
                0.5f32..2.0,
                -1.0f32..1.0,
            ),
            prop_oneof![
                Just(VerifyMode::Stochastic),
                Just(VerifyMode::Deterministic)
            ],
            any::<u64>(),
        )
            .prop_map(
                move |(
                    mut logits,
                    draft_logits,
                    (t, top_k, top_p, min_p, rep, pres),
                    mode,
                    seed,
                )| {
                    // Every target row needs one finite logit.
                    for r in 0..=k {
                        logits[r * vocab] = 0.0;
                    }
                    Round {
                        vocab,
                        k,
                        logits,
                        draft_logits,
                        params: SamplingParams {
                            temperature: if t < 0.1 { 0.0 } else { t },
                            top_k,
                            top_p,
                            min_p,
                            repetition_penalty: rep,
                            presence_penalty: pres,
                            frequency_penalty: 0.0,
                            min_tokens: 0,
                        },
                        mode,
                        seed,
                    }
                },
            )
    })
}

/// Draft with the same params, then verify.
fn run(r: &Round) -> (Verification, Vec<u32>) {
    let mut s = Sampler::new(r.vocab);
    let mut rng = Rng::seed_from_u64(r.seed);
    let mut ctx = PenaltyContext::new(r.vocab);
    ctx.push(0).unwrap();
    let mut q = vec![0f32; r.k * r.vocab];
    let mut d = Vec::new();
    for i in 0..r.k {
        let row = &r.draft_logits[i * r.vocab..(i + 1) * r.vocab];
        let t = s
            .sample_draft(
                row,
                &r.params,
                Some(&ctx),
                &mut rng,
                &mut q[i * r.vocab..(i + 1) * r.vocab],
            )
            .unwrap();
        d.push(t);
        ctx.push(t).unwrap();
    }
    ctx.truncate(1);
    let v = verify(
        &mut s, &r.logits, &q, &d, &r.params, r.mode, &mut ctx, &mut rng,
    )
    .unwrap();
    assert_eq!(ctx.len(), 1, "verify restores the penalty context");
    (v, d)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn round_is_well_formed(r in round()) {
        let (v, d) = run(&r);
        prop_assert!(v.n_accepted <= r.k);
        prop_assert_eq!(v.tokens.len(), v.n_accepted + 1);
        prop_assert!(v.tokens.iter().all(|&t| (t as usize) < r.vocab));
        prop_assert_eq!(&v.tokens[..v.n_accepted], &d[..v.n_accepted]);
        prop_assert!(v.accept_probs.iter().all(|&a| (0.0..=1.0).contains(&a)));
    }

    #[test]
    fn round_is_deterministic_for_a_seed(r in round()) {
        prop_assert_eq!(run(&r).0, run(&r).0);
    }

    #[test]
    fn emitted_tokens_have_positive_target_probability(r in round()) {
        let (v, _) = run(&r);
        let mut s = Sampler::new(r.vocab);
        let mut ctx = PenaltyContext::new(r.vocab);
        ctx.push(0).unwrap();
        for (i, &t) in v.tokens.iter().enumerate() {
            s.process(&r.logits[i * r.vocab..(i + 1) * r.vocab], i, &r.params, Some(&ctx)).unwrap();
            prop_assert!(s.prob(t) > 0.0, "row {} token {} has p = 0", i, t);
            ctx.push(t).unwrap();
        }
    }
}

#[test]
fn largest_vocab_and_k_run() {
    const VOCAB: usize = 262_144;
    const K: usize = specrt_core::MAX_DRAFT_TOKENS;
    let params = SamplingParams {
        top_p: 0.9,
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(VOCAB);
    let mut rng = Rng::seed_from_u64(9);
    let mut ctx = PenaltyContext::new(VOCAB);
    // Identical peaked rows for draft and target: every draft token is accepted.
    #[allow(clippy::cast_precision_loss)]
    let row: Vec<f32> = (0..VOCAB).map(|i| -((i % 977) as f32) * 0.05).collect();
    let mut q = vec![0f32; K * VOCAB];
    let mut d = Vec::new();
    for i in 0..K {
        d.push(
            s.sample_draft(
                &row,
                &params,
                None,
                &mut rng,
                &mut q[i * VOCAB..(i + 1) * VOCAB],
            )
            .unwrap(),
        );
    }
    let logits: Vec<f32> = (0..=K).flat_map(|_| row.iter().copied()).collect();
    let v = verify(
        &mut s,
        &logits,
        &q,
        &d,
        &params,
        VerifyMode::Stochastic,
        &mut ctx,
        &mut rng,
    )
    .unwrap();
    assert_eq!(v.n_accepted, K);
    assert_eq!(v.tokens.len(), K + 1);
}
