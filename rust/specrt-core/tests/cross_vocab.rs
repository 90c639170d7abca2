//! A draft of another tokenizer (token-level intersection): `specrt_core::cross_vocab`.
//!
//! Vocabularies: the target's 8 strings `a b c d ab cd e f`, the draft's 7 strings `a b c d bc e x`. Shared: `a b c d
//! e` (target ids 0 1 2 3 6, draft ids 0 1 2 3 5). The target's `ab` and `cd` are spelled as two draft tokens, its `f`
//! has no spelling (the fallback, draft `x`); the draft's `bc` and `x` are never proposed. The mock models' logits are
//! pseudo-random functions of their last tokens, so a draft fed the wrong spelling or rolled back to the wrong
//! position gives other rows, which the adapter tests compare position by position against a fresh model fed the
//! expected draft tokens.
//!
//! Distribution test (as `tests/vocab_widths.rs`): `DRAWS` = 40,000 two-token generations at T = 1 (seeds 0..DRAWS)
//! against the target's exact `p(t1) p(t2 | t1)`. Tolerance: Pearson chi-square over the cells with expected count at
//! least 5 below the chi-square quantile at z = 4.3 (one-sided ~1e-5, Wilson-Hilferty); no emitted pair of target
//! probability 0; the first token's frequency on the target-only ids (which the draft never proposes: they come from
//! the residual and the bonus row only) within 4.3 binomial standard deviations `sqrt(p (1 - p) / DRAWS)` of its
//! probability `p`. Fixed seeds make the outcome deterministic. The broken variant that must fail the same check: the
//! intersection applied to the target as well (verification over the shared strings only), which never emits the
//! target-only tokens.

mod common;

use common::{fit_two_tokens, greedy, run_batch, softmax, t1, Fit};

use specrt_core::testing::{MockBatchModel, MockModel};
use specrt_core::{
    Backend, BatchBackend, BatchEngine, BatchOptions, BatchRow, CrossVocabBatchDraft,
    CrossVocabDraft, Engine, GenerationConfig, Result, VocabMap,
};

const TARGET: [&str; 8] = ["a", "b", "c", "d", "ab", "cd", "e", "f"];
const DRAFT: [&str; 7] = ["a", "b", "c", "d", "bc", "e", "x"];
/// Target ids the draft cannot propose.
const TARGET_ONLY: [u32; 3] = [4, 5, 7];
const FALLBACK: u32 = 6;
const MAX_SEQ: usize = 256;
const DRAWS: u64 = 40_000;
const Z: f64 = 4.3;
const PROMPT: [u32; 4] = [0, 4, 2, 6];

/// The map of the two string vocabularies: shared strings by equality, other target strings spelled by greedy
/// longest match over the draft's strings (a stand-in for the draft tokenizer's encoding).
fn map() -> VocabMap {
    let target_of_draft: Vec<Option<u32>> = DRAFT
        .iter()
        .map(|d| TARGET.iter().position(|t| t == d).map(|t| t as u32))
        .collect();
    let spellings: Vec<Vec<u32>> = TARGET.iter().map(|t| spell(t)).collect();
    VocabMap::new(
        TARGET.len(),
        DRAFT.len(),
        &target_of_draft,
        &spellings,
        FALLBACK,
    )
    .unwrap()
}

fn spell(mut s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    while !s.is_empty() {
        let Some((id, d)) = DRAFT
            .iter()
            .enumerate()
            .filter(|(_, d)| s.starts_with(**d))
            .max_by_key(|(_, d)| d.len())
        else {
            return Vec::new();
        };
        out.push(id as u32);
        s = &s[d.len()..];
    }
    out
}

/// The draft tokens a target sequence is fed as.
fn spelled(m: &VocabMap, seq: &[u32]) -> Vec<u32> {
    seq.iter()
        .flat_map(|&t| m.spelling(t).unwrap().to_vec())
        .collect()
}

fn target(scale: f32) -> MockModel {
    MockModel::new(TARGET.len(), MAX_SEQ, 11, scale)
}

fn draft(scale: f32) -> MockModel {
    MockModel::new(DRAFT.len(), MAX_SEQ, 11, scale).with_noise(5, 0.5)
}

fn cross(d: MockModel) -> Box<dyn Backend> {
    Box::new(CrossVocabDraft::new(Box::new(d), map()).unwrap())
}

#[test]
fn the_map_shares_equal_strings_and_spells_the_rest() {
    let m = map();
    let o = m.overlap();
    assert_eq!((o.target_width, o.draft_width, o.shared), (8, 7, 5));
    assert_eq!(o.multi_token_spellings, 2); // ab, cd
    assert_eq!(m.spelling(4).unwrap(), [0, 1]);
    assert_eq!(m.spelling(5).unwrap(), [2, 3]);
    assert_eq!(m.spelling(6).unwrap(), [5]);
    assert_eq!(m.spelling(7).unwrap(), [FALLBACK]);
    assert!(m.spelling(8).is_err());
    assert_eq!(m.target_of(4), None); // bc
    assert_eq!(m.target_of(5), Some(6)); // e
    let mut row = [0f32; 8];
    m.map_row(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &mut row);
    let ninf = f32::NEG_INFINITY;
    assert_eq!(row, [0.0, 1.0, 2.0, 3.0, ninf, ninf, 5.0, ninf]);
}

#[test]
fn a_bad_map_is_refused_naming_what_is_wrong() {
    let err = |r: Result<VocabMap>| r.unwrap_err().to_string();
    let e = err(VocabMap::new(4, 2, &[Some(1), Some(1)], &[], 0));
    assert!(e.contains("draft ids 0 and 1 both name target id 1"), "{e}");
    let e = err(VocabMap::new(4, 2, &[None, None], &[], 0));
    assert!(e.contains("share no token string"), "{e}");
    let e = err(VocabMap::new(4, 2, &[Some(4), None], &[], 0));
    assert!(
        e.contains("target id 4") && e.contains("target width 4"),
        "{e}"
    );
    let e = err(VocabMap::new(4, 2, &[Some(0), None], &[vec![], vec![2]], 0));
    assert!(e.contains("target id 1's spelling holds draft id 2"), "{e}");
    let e = err(VocabMap::new(4, 2, &[Some(0), None], &[], 5));
    assert!(e.contains("fallback draft id 5"), "{e}");
    let e = err(VocabMap::new(4, 3, &[Some(0), None], &[], 0));
    assert!(e.contains("2 draft entries for a draft of width 3"), "{e}");
}

/// A simple deterministic generator for the adapter walks.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// The rows a cross-vocabulary draft must give after the target sequence `seq` for its last `n` positions: the draft
/// model's row after the spelling of each prefix, mapped; rows without context (uniform over the shared strings)
/// when the whole spelling outgrows the model's cache.
fn expected_rows(m: &VocabMap, model: &MockModel, seq: &[u32], n: usize) -> Vec<f32> {
    let mut out = Vec::new();
    if spelled(m, seq).len() > model.max_seq_len() {
        let mut row = vec![0f32; TARGET.len()];
        m.uninformed_row(&mut row);
        return row.repeat(n);
    }
    for i in seq.len() - n..seq.len() {
        let sp = spelled(m, &seq[..=i]);
        let mut row = vec![0f32; DRAFT.len()];
        model.row(&sp, &mut row);
        let mut mapped = vec![0f32; TARGET.len()];
        m.map_row(&row, &mut mapped);
        out.extend(mapped);
    }
    out
}

#[test]
fn the_draft_sees_each_prefix_in_its_own_spelling_through_rollbacks() {
    // Random walks of forward calls (new tokens, rollbacks to any valid position, several rows of logits): every row
    // equals a fresh draft model's row after the expected spelling.
    walk_single(draft(2.0));
}

#[test]
fn a_spelling_longer_than_the_drafts_cache_gives_rows_without_context_until_a_rollback() {
    // A draft cache of 20 positions: the walk's sequences outgrow it and come back within it.
    walk_single(MockModel::new(DRAFT.len(), 20, 11, 2.0).with_noise(5, 0.5));
}

/// A rollback: to any position one step in eight, else by at most 3 target tokens (sequences then grow past a small
/// draft cache and come back).
fn rollback(rng: &mut Lcg, len: usize) -> usize {
    if rng.below(8) == 0 {
        rng.below(len + 1)
    } else {
        len - rng.below(len.min(3) + 1)
    }
}

fn walk_single(model: MockModel) {
    let m = map();
    let mut a = CrossVocabDraft::new(Box::new(model.clone()), m.clone()).unwrap();
    let mut rng = Lcg(7);
    let mut seq: Vec<u32> = Vec::new();
    let (mut over, mut within) = (0, 0);
    for step in 0..400 {
        let n_past = rollback(&mut rng, seq.len());
        seq.truncate(n_past);
        let n_new = 1 + rng.below(5);
        let tokens: Vec<u32> = (0..n_new).map(|_| rng.below(TARGET.len()) as u32).collect();
        seq.extend(&tokens);
        let n_logits = 1 + rng.below(n_new);
        let got = a.forward(&tokens, n_past, n_logits).unwrap().to_vec();
        assert_eq!(
            got,
            expected_rows(&m, &model, &seq, n_logits),
            "step {step}: {seq:?}"
        );
        if spelled(&m, &seq).len() > model.max_seq_len() {
            over += 1;
        } else {
            within += 1;
        }
    }
    assert!(within > 50, "{within} calls within the draft's cache");
    if model.max_seq_len() < 64 {
        assert!(over > 50, "{over} calls beyond the draft's cache");
    }
    // A position beyond what was fed is an error, not a silent misalignment.
    let n = seq.len();
    assert!(a.forward(&[0], n + 1, 1).is_err());
    // A failed call leaves the track where the engine believes it is.
    assert!(a.forward(&[99], 2, 1).is_err());
    let got = a.forward(&[1], 2, 1).unwrap().to_vec();
    let mut s2 = seq[..2].to_vec();
    s2.push(1);
    assert_eq!(got, expected_rows(&m, &model, &s2, 1));
}

#[test]
fn the_batched_draft_keeps_each_slots_spelling_through_moves_and_prefixes() {
    walk_batched(draft(2.0));
}

#[test]
fn a_batched_spelling_longer_than_the_drafts_cache_gives_rows_without_context() {
    walk_batched(MockModel::new(DRAFT.len(), 20, 11, 2.0).with_noise(5, 0.5));
}

fn walk_batched(model: MockModel) {
    let m = map();
    let mut a =
        CrossVocabBatchDraft::new(Box::new(MockBatchModel::new(&model, 3)), m.clone()).unwrap();
    let mut rng = Lcg(11);
    let mut seqs: Vec<Vec<u32>> = vec![Vec::new(); 3];
    let mut stored: Option<Vec<u32>> = None;
    let (mut over, mut within) = (0, 0);
    for step in 0..300 {
        match rng.below(10) {
            0 => {
                // Move a slot's first n positions into another slot.
                let (from, to) = (rng.below(3), rng.below(3));
                let n = rollback(&mut rng, seqs[from].len());
                a.move_slot(from, to, n).unwrap();
                seqs[to] = seqs[from][..n].to_vec();
            }
            1 => {
                let slot = rng.below(3);
                let n = rng.below(seqs[slot].len() + 1);
                a.store_prefix(9, slot, n).unwrap();
                stored = Some(seqs[slot][..n].to_vec());
            }
            2 if stored.is_some() => {
                let p = stored.as_ref().unwrap();
                let slot = rng.below(3);
                let n = rng.below(p.len() + 1);
                a.load_prefix(9, slot, n).unwrap();
                seqs[slot] = p[..n].to_vec();
            }
            _ => {
                let first = rng.below(3);
                let n_rows = 1 + rng.below(3 - first);
                let mut toks = Vec::new();
                for r in 0..n_rows {
                    let s = &mut seqs[first + r];
                    // Some rows sit the pass out.
                    let n_new = if rng.below(4) == 0 {
                        0
                    } else {
                        1 + rng.below(4)
                    };
                    let n_past = rollback(&mut rng, s.len());
                    if n_new > 0 {
                        s.truncate(n_past);
                    }
                    let t: Vec<u32> = (0..n_new).map(|_| rng.below(TARGET.len()) as u32).collect();
                    toks.push((t, n_past));
                }
                let width = toks.iter().map(|(t, _)| t.len()).max().unwrap();
                if width == 0 {
                    continue;
                }
                let rows: Vec<BatchRow<'_>> = toks
                    .iter()
                    .map(|(t, n_past)| BatchRow {
                        tokens: t,
                        n_past: *n_past,
                    })
                    .collect();
                let n_logits = 1 + rng.below(width);
                let got = a.forward_rows(first, &rows, n_logits).unwrap().to_vec();
                let tw = TARGET.len();
                for (r, (t, _)) in toks.iter().enumerate() {
                    if t.is_empty() {
                        continue;
                    }
                    let s = &mut seqs[first + r];
                    s.extend(t);
                    let row_over = spelled(&m, s).len() > model.max_seq_len();
                    if row_over {
                        over += 1;
                    } else {
                        within += 1;
                    }
                    // Padded position j of this row is token j; the last n_logits of `width` positions came back.
                    for jj in 0..n_logits {
                        let j = width - n_logits + jj;
                        if j >= t.len() {
                            continue;
                        }
                        let upto = s.len() - t.len() + j + 1;
                        // The whole row's spelling decides whether the draft read its context.
                        let want = if row_over {
                            expected_rows(&m, &model, s, 1)
                        } else {
                            expected_rows(&m, &model, &s[..upto], 1)
                        };
                        let at = (r * n_logits + jj) * tw;
                        assert_eq!(&got[at..at + tw], &want[..], "step {step}, row {r}, j {j}");
                    }
                }
            }
        }
    }
    assert!(within > 50, "{within} rows within the draft's cache");
    if model.max_seq_len() < 64 {
        assert!(over > 10, "{over} rows beyond the draft's cache");
    }
}

#[test]
fn greedy_speculation_equals_target_only_with_another_tokenizer() {
    // The target's favourite tokens include target-only ids (ab, cd, f): the draft never proposes them, the target
    // emits them from its own rows, and the draft is fed their spellings.
    let prompts: [&[u32]; 3] = [&[3, 1, 4], &[7, 5], &[2, 2, 6, 1]];
    let mut plain = Engine::new(Box::new(target(4.0)), None).unwrap();
    let mut spec = Engine::new(Box::new(target(4.0)), Some(cross(draft(4.0)))).unwrap();
    let mut target_only = 0;
    let mut accepted = 0;
    for prompt in prompts {
        let reference = plain.generate(prompt, greedy(0, 48), |_| true).unwrap();
        target_only += reference
            .tokens
            .iter()
            .filter(|t| TARGET_ONLY.contains(t))
            .count();
        for k in [1, 3, 8] {
            let cfg = GenerationConfig {
                logprobs: true,
                top_logprobs: 2,
                ..greedy(k, 48)
            };
            let with = GenerationConfig {
                logprobs: true,
                top_logprobs: 2,
                ..greedy(0, 48)
            };
            let reference = plain.generate(prompt, with, |_| true).unwrap();
            let out = spec.generate(prompt, cfg, |_| true).unwrap();
            assert_eq!(out.tokens, reference.tokens, "K={k} {prompt:?}");
            assert_eq!(out.logprobs, reference.logprobs);
            assert_eq!(out.top_logprobs, reference.top_logprobs);
            accepted += out.stats.n_accepted;
        }
    }
    assert!(
        target_only > 5,
        "the test needs target-only tokens: {target_only}"
    );
    assert!(accepted > 20, "the draft was never accepted: {accepted}");
}

#[test]
fn batched_greedy_speculation_equals_target_only_with_another_tokenizer() {
    let prompts: Vec<Vec<u32>> = vec![
        vec![3, 1, 4],
        vec![7, 5],
        vec![2, 2, 6, 1],
        vec![3, 1, 4, 0],
    ];
    let batch_target = || Box::new(MockBatchModel::new(&target(4.0), 4)) as Box<dyn BatchBackend>;
    let batch_draft = || {
        Box::new(
            CrossVocabBatchDraft::new(Box::new(MockBatchModel::new(&draft(4.0), 4)), map())
                .unwrap(),
        ) as Box<dyn BatchBackend>
    };
    let mut plain = Engine::new(Box::new(target(4.0)), None).unwrap();
    for prefix_caching in [false, true] {
        let opts = BatchOptions {
            prefix_caching,
            ..BatchOptions::default()
        };
        let mut spec = BatchEngine::new(batch_target(), Some(batch_draft()), opts).unwrap();
        for k in [2, 5] {
            // Twice: with prefix caching the second pass reuses stored prefixes of both models.
            for _ in 0..2 {
                let reqs: Vec<(Vec<u32>, GenerationConfig)> =
                    prompts.iter().map(|p| (p.clone(), greedy(k, 40))).collect();
                let outs = run_batch(&mut spec, &reqs);
                for (p, out) in prompts.iter().zip(&outs) {
                    let reference = plain.generate(p, greedy(0, 40), |_| true).unwrap();
                    assert_eq!(
                        out.tokens, reference.tokens,
                        "K={k} caching={prefix_caching} {p:?}"
                    );
                    assert!(out.stats.n_accepted > 0, "K={k} {p:?}");
                }
            }
        }
    }
}

/// BROKEN: the target restricted to the shared strings as well (`-inf` on its target-only ids): verification over
/// the intersection only, which is lossy.
struct SharedOnlyTarget(MockModel, Vec<f32>);

impl Backend for SharedOnlyTarget {
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
    fn max_seq_len(&self) -> usize {
        self.0.max_seq_len()
    }
    fn forward(&mut self, tokens: &[u32], n_past: usize, n_logits: usize) -> Result<&[f32]> {
        self.1 = self.0.forward(tokens, n_past, n_logits)?.to_vec();
        for row in self.1.chunks_exact_mut(TARGET.len()) {
            for &t in &TARGET_ONLY {
                row[t as usize] = f32::NEG_INFINITY;
            }
        }
        Ok(&self.1)
    }
}

/// `DRAWS` two-token generations on `engine`, fitted to the mock target's law; marked: the target-only ids.
fn fit(engine: &mut Engine, cfg: &GenerationConfig) -> Fit {
    let model = target(1.5);
    let law = |seq: &[u32]| {
        let mut r = vec![0f32; TARGET.len()];
        model.row(seq, &mut r);
        softmax(&r)
    };
    let only = |t: u32| TARGET_ONLY.contains(&t);
    fit_two_tokens(engine, law, &PROMPT, cfg, DRAWS, Z, only)
}

#[test]
fn sampling_with_another_tokenizer_keeps_the_targets_distribution() {
    for coupled in [false, true] {
        let cfg = GenerationConfig { coupled, ..t1(3) };
        let mut e = Engine::new(Box::new(target(1.5)), Some(cross(draft(1.5)))).unwrap();
        let f = fit(&mut e, &cfg);
        eprintln!(
            "cross-vocabulary (coupled {coupled}): {f:?}, tolerance on target-only ids {:.4}",
            f.marked_tolerance()
        );
        assert!(f.marked_expected > 0.15, "{f:?}");
        assert!(f.passes(), "{f:?}");
    }
}

#[test]
fn the_test_catches_verification_over_the_intersection_only() {
    let broken = SharedOnlyTarget(target(1.5), Vec::new());
    let mut e = Engine::new(Box::new(broken), Some(cross(draft(1.5)))).unwrap();
    let f = fit(&mut e, &t1(3));
    eprintln!("broken (target restricted to the intersection): {f:?}");
    assert!(!f.passes(), "the broken pair passed: {f:?}");
    assert!(f.marked_observed == 0.0 && f.chi2 > f.critical, "{f:?}");
}
