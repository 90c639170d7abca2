//! `BatchedOrtBackend` against the batch-1 `OrtBackend`. The tests run only when `SPECRT_ORT_LIBRARY` (absolute path
//! of libonnxruntime.so.1.x), `SPECRT_TEST_MODEL` (a GQA batch-1 model folder) and `SPECRT_TEST_BATCHED_MODEL` (the
//! same weights converted with `attention="batched"`) are set, as `make test-rs` does; otherwise they return early.

use std::path::PathBuf;

use specrt_core::backend::{Backend, BatchBackend, BatchRow};
use specrt_core::SpecError;
use specrt_ort::{BatchedOrtBackend, OrtBackend, OrtOptions, Provider};

/// Cache length of the batched backend (short, so the capacity edge is cheap to reach).
const L: usize = 48;
const MAX_BATCH: usize = 4;

fn env_paths() -> Option<(PathBuf, PathBuf, PathBuf)> {
    Some((
        std::env::var_os("SPECRT_ORT_LIBRARY")?.into(),
        std::env::var_os("SPECRT_TEST_MODEL")?.into(),
        std::env::var_os("SPECRT_TEST_BATCHED_MODEL")?.into(),
    ))
}

fn options(lib: &PathBuf, max_seq_len: usize) -> OrtOptions {
    let mut options = OrtOptions::new(lib);
    options.max_seq_len = Some(max_seq_len);
    options.intra_op_threads = Some(1);
    options
}

/// The batched backend, the batch-1 reference, and what each slot's cache holds (its sequence).
struct Harness {
    batched: BatchedOrtBackend,
    reference: OrtBackend,
    slots: Vec<Vec<u32>>,
    vocab: usize,
    /// Row-logit comparisons done (to prove the checks ran).
    checked: usize,
}

impl Harness {
    /// A batched backend with cache length `l` (capped at the model's 256 positions), and the reference.
    fn new(lib: &PathBuf, gqa: &PathBuf, batched: &PathBuf, l: usize) -> Self {
        let batched = BatchedOrtBackend::new(batched, &options(lib, l), MAX_BATCH).unwrap();
        let reference = OrtBackend::new(gqa, &options(lib, l)).unwrap();
        let vocab = batched.vocab_size();
        assert_eq!(vocab, reference.vocab_size());
        assert_eq!(batched.max_seq_len(), reference.max_seq_len());
        assert_eq!(batched.max_batch(), MAX_BATCH);
        Harness {
            batched,
            reference,
            slots: vec![Vec::new(); MAX_BATCH],
            vocab,
            checked: 0,
        }
    }

    /// Run `rows` (`(n_past, tokens)`) on slots `first_slot..`, then check every real token's logits (those among
    /// the last `n_logits` padded positions) against the batch-1 model run on the slot's whole sequence.
    fn pass(&mut self, first_slot: usize, rows: &[(usize, Vec<u32>)], n_logits: usize) {
        let batch: Vec<BatchRow<'_>> = rows
            .iter()
            .map(|(n_past, tokens)| BatchRow {
                tokens,
                n_past: *n_past,
            })
            .collect();
        let s = rows.iter().map(|(_, t)| t.len()).max().unwrap();
        let got = self
            .batched
            .forward_rows(first_slot, &batch, n_logits)
            .unwrap()
            .to_vec();
        assert_eq!(got.len(), rows.len() * n_logits * self.vocab);
        let v = self.vocab;
        for (r, (n_past, tokens)) in rows.iter().enumerate() {
            let slot = first_slot + r;
            if tokens.is_empty() {
                continue; // sat the pass out: its cache must be untouched (checked by later passes)
            }
            let seq = &mut self.slots[slot];
            assert!(*n_past <= seq.len(), "test bug: n_past beyond the slot");
            seq.truncate(*n_past);
            seq.extend_from_slice(tokens);
            let m = tokens.len();
            assert_eq!(self.batched.cached_len(slot), Some(seq.len()));
            let want = self.reference.forward(seq, 0, m).unwrap(); // [m, vocab]: the pass's tokens
            for j in (s - n_logits)..m {
                let at = (r * n_logits + j - (s - n_logits)) * v;
                let row = &got[at..at + v];
                let reference = &want[j * v..(j + 1) * v];
                let err = row
                    .iter()
                    .zip(reference)
                    .map(|(a, b)| (a - b).abs() - 1e-4 * b.abs())
                    .fold(f32::MIN, f32::max);
                assert!(
                    err <= 1e-4,
                    "slot {slot} (n_past {n_past}, {m} tokens, s {s}, n_logits {n_logits}), token {j}: \
                     max |err| - 1e-4 |ref| = {err}"
                );
                self.checked += 1;
            }
        }
    }

    fn move_slot(&mut self, from: usize, to: usize, n_valid: usize) {
        self.batched.move_slot(from, to, n_valid).unwrap();
        self.slots[to] = self.slots[from][..n_valid].to_vec();
        assert_eq!(self.batched.cached_len(to), Some(n_valid));
    }

    fn len(&self, slot: usize) -> usize {
        self.slots[slot].len()
    }
}

fn tokens(seed: u32, n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (seed * 131 + i * 37 + 11) % vocab as u32)
        .collect()
}

#[test]
fn ragged_rows_match_their_batch_1_runs() {
    let Some((lib, gqa, batched)) = env_paths() else {
        return;
    };
    let mut h = Harness::new(&lib, &gqa, &batched, L);
    let v = h.vocab;
    let kv = h.batched.kv_buffer_addresses();

    // Prefill, right-padded to 9 (all logits); steps alternate between all logits and the last 2 padded positions.
    h.pass(
        0,
        &[
            (0, tokens(1, 5, v)),
            (0, tokens(2, 9, v)),
            (0, tokens(3, 2, v)),
        ],
        9,
    );
    // Steps of 1-4 tokens per row; a row sits out (its cache must be left as it is).
    for (step, sizes) in [[3, 3, 3], [1, 4, 2], [0, 2, 3], [4, 0, 1], [2, 1, 4]]
        .iter()
        .enumerate()
    {
        let rows: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(slot, &k)| {
                (
                    h.len(slot),
                    tokens(10 + step as u32 * 3 + slot as u32, k, v),
                )
            })
            .collect();
        let s = *sizes.iter().max().unwrap();
        h.pass(0, &rows, if step % 2 == 0 { s } else { 2.min(s) });
    }
    // Rollback: slot 1 drops its last 7 positions, slot 0 its last one; slot 2 goes on.
    let rows = vec![
        (h.len(0) - 1, tokens(40, 3, v)),
        (h.len(1) - 7, tokens(41, 2, v)),
        (h.len(2), tokens(42, 1, v)),
    ];
    h.pass(0, &rows, 3);
    h.pass(
        0,
        &[
            (h.len(0), tokens(43, 1, v)),
            (h.len(1), tokens(44, 1, v)),
            (h.len(2), tokens(45, 1, v)),
        ],
        1,
    );

    // Slot 0's row leaves: slot 2's row moves into slot 0, a new prompt takes slot 2 (overwriting its start), and
    // the moved row goes on from its new slot beside slot 1's.
    let n2 = h.len(2);
    h.move_slot(2, 0, n2);
    h.pass(
        0,
        &[
            (n2, tokens(50, 3, v)),
            (h.len(1), tokens(51, 2, v)),
            (0, tokens(52, 6, v)),
        ],
        6,
    );
    // A range that does not start at slot 0, and a single row on the last slot after a move.
    h.pass(
        1,
        &[(h.len(1), tokens(53, 2, v)), (h.len(2), tokens(54, 4, v))],
        4,
    );
    let n1 = h.len(1);
    h.move_slot(1, 3, n1);
    h.move_slot(3, 3, n1); // from == to: nothing changes
    h.pass(3, &[(n1, tokens(55, 3, v))], 3);

    // The capacity edge: slot 3 fills to exactly L while slot 2 takes 4 tokens (slot 3's pads would sit at
    // positions >= L: they must be neither written nor out of the rotary range), then slot 3 rolls back and
    // continues (a write past its row would have hit its own keys at positions 0..3 of the next head_dim row).
    let fill = L - 1 - h.len(3);
    h.pass(3, &[(h.len(3), tokens(60, fill, v))], 1);
    assert_eq!(h.len(3), L - 1);
    h.pass(
        2,
        &[(h.len(2), tokens(61, 4, v)), (L - 1, tokens(62, 1, v))],
        4,
    );
    assert_eq!(h.len(3), L);
    h.pass(2, &[(h.len(2), vec![]), (L - 10, tokens(63, 4, v))], 4);
    h.pass(
        0,
        &[
            (h.len(0), tokens(64, 2, v)),
            (h.len(1), vec![]),
            (h.len(2), tokens(65, 1, v)),
            (h.len(3), tokens(66, 3, v)),
        ],
        3,
    );

    assert!(h.checked >= 80, "only {} rows were compared", h.checked);
    assert_eq!(
        kv,
        h.batched.kv_buffer_addresses(),
        "KV buffers must never move"
    );
}

/// The KV window (`BatchedOrtBackend::kv_window`): the cache length a pass reads follows the longest cached row, not
/// `max_seq_len`. Rows that outgrow it move to a longer window and rows that outlive a shrink move to a shorter one,
/// in place, and every row's logits still match its batch-1 run (a row moved to a wrong offset, or a shrink that
/// dropped a live position, fails the comparison).
#[test]
fn the_kv_window_follows_the_longest_row_and_moves_rows_intact() {
    use specrt_ort::KV_WINDOW_STEP as STEP;
    let Some((lib, gqa, batched)) = env_paths() else {
        return;
    };
    let full = 256; // the test model's max_position_embeddings
    let mut h = Harness::new(&lib, &gqa, &batched, full);
    let v = h.vocab;
    let kv = h.batched.kv_buffer_addresses();
    assert_eq!(h.batched.kv_window(), STEP);

    h.pass(0, &[(0, tokens(1, 100, v)), (0, tokens(2, 20, v))], 100);
    assert_eq!(h.batched.kv_window(), STEP, "100 positions fit");
    // Slot 0 outgrows the window in a pass beside slot 1: both rows move first.
    h.pass(0, &[(100, tokens(3, 40, v)), (20, tokens(4, 3, v))], 3);
    assert_eq!(
        h.batched.kv_window(),
        2 * STEP,
        "140 positions: the next step"
    );
    h.pass(0, &[(140, tokens(5, 2, v)), (23, tokens(6, 2, v))], 2);
    // Slot 2 joins; slot 0 rolls back and then starts a new short prompt: the longest row is now 25 positions, and
    // the window shrinks with slot 1's and slot 2's rows moved to it.
    h.pass(1, &[(25, vec![]), (0, tokens(7, 9, v))], 9);
    h.pass(0, &[(0, tokens(8, 10, v))], 10);
    assert_eq!(
        h.batched.kv_window(),
        2 * STEP,
        "slot 0 cached 142 positions before this pass"
    );
    h.pass(
        0,
        &[
            (10, tokens(9, 2, v)),
            (25, tokens(10, 4, v)),
            (9, tokens(11, 1, v)),
        ],
        4,
    );
    assert_eq!(
        h.batched.kv_window(),
        STEP,
        "29 positions: back to one step"
    );
    // A moved row (slot 1 to slot 3) continues after the shrink.
    let n1 = h.len(1);
    h.move_slot(1, 3, n1);
    h.pass(3, &[(n1, tokens(12, 3, v))], 3);
    assert!(h.checked >= 150, "only {} rows were compared", h.checked);
    assert_eq!(
        kv,
        h.batched.kv_buffer_addresses(),
        "KV buffers must never move"
    );
}

/// At the model's last position (`max_position_embeddings` = 256 = the rows of its rotary cache), pads and rows that
/// sit out must still be fed valid positions: `n_past + j` would index past the rotary cache.
#[test]
fn pads_at_the_last_position_stay_in_the_rotary_range() {
    let Some((lib, gqa, batched)) = env_paths() else {
        return;
    };
    let mut h = Harness::new(&lib, &gqa, &batched, 10_000);
    let l = h.batched.max_seq_len();
    assert_eq!(l, 256, "the tiny model has 256 positions");
    let v = h.vocab;
    h.pass(0, &[(0, tokens(1, l - 1, v)), (0, tokens(2, 3, v))], 1);
    h.pass(0, &[(l - 1, tokens(3, 1, v)), (3, tokens(4, 4, v))], 4);
    h.pass(0, &[(l, vec![]), (7, tokens(5, 2, v))], 2);
    h.pass(0, &[(l - 2, tokens(6, 2, v)), (9, tokens(7, 3, v))], 3);
}

#[test]
fn bad_passes_are_errors_and_leave_the_cache_as_it_was() {
    let Some((lib, gqa, batched)) = env_paths() else {
        return;
    };
    let mut h = Harness::new(&lib, &gqa, &batched, L);
    let v = h.vocab;
    h.pass(0, &[(0, tokens(1, 4, v)), (0, tokens(2, 6, v))], 6);
    let t = tokens(3, 3, v);
    let row = |n_past: usize, tokens: &'static [u32]| BatchRow { tokens, n_past };
    let b = &mut h.batched;

    let two = [
        BatchRow {
            tokens: &t,
            n_past: 4,
        },
        BatchRow {
            tokens: &t,
            n_past: 6,
        },
    ];
    let err = b.forward_rows(3, &two, 1).unwrap_err();
    assert!(
        matches!(err, SpecError::Config(ref m) if m.contains("max_batch 4")),
        "{err}"
    );
    let err = b.forward_rows(usize::MAX, &two, 1).unwrap_err();
    assert!(matches!(err, SpecError::Config(_)), "{err}");
    let err = b.forward_rows(0, &[], 1).unwrap_err();
    assert!(
        matches!(err, SpecError::Config(ref m) if m.contains("empty")),
        "{err}"
    );
    let err = b
        .forward_rows(0, &[row(4, &[]), row(6, &[])], 1)
        .unwrap_err();
    assert!(
        matches!(err, SpecError::Config(ref m) if m.contains("empty")),
        "{err}"
    );
    for n_logits in [0, 4] {
        let err = b.forward_rows(0, &two, n_logits).unwrap_err();
        assert!(
            matches!(err, SpecError::Config(ref m) if m.contains(&format!("n_logits {n_logits}")) && m.contains("3")),
            "{err}"
        );
    }
    let long = tokens(4, L - 4 + 1, v);
    let err = b
        .forward_rows(
            0,
            &[
                BatchRow {
                    tokens: &long,
                    n_past: 4,
                },
                BatchRow {
                    tokens: &t,
                    n_past: 6,
                },
            ],
            1,
        )
        .unwrap_err();
    assert!(
        matches!(err, SpecError::Length(ref m) if m.contains("max_seq_len 48")),
        "{err}"
    );
    let err = b
        .forward_rows(
            0,
            &[
                row(4, &[]),
                BatchRow {
                    tokens: &t,
                    n_past: L,
                },
            ],
            1,
        )
        .unwrap_err();
    assert!(matches!(err, SpecError::Length(_)), "{err}");
    // n_past beyond what the slot holds; a token outside the vocabulary.
    let err = b
        .forward_rows(
            0,
            &[BatchRow {
                tokens: &t,
                n_past: 5,
            }],
            1,
        )
        .unwrap_err();
    assert!(
        matches!(err, SpecError::Config(ref m) if m.contains("cached in slot 0")),
        "{err}"
    );
    let bad = [1, v as u32];
    let err = b
        .forward_rows(
            0,
            &[BatchRow {
                tokens: &bad,
                n_past: 4,
            }],
            1,
        )
        .unwrap_err();
    assert!(matches!(err, SpecError::Vocab(_)), "{err}");
    // move_slot: slots and n_valid out of range.
    for (from, to, n) in [(4, 0, 1), (0, 4, 1), (0, 1, L + 1), (0, 1, 5)] {
        let err = b.move_slot(from, to, n).unwrap_err();
        assert!(
            matches!(err, SpecError::Config(_)),
            "move_slot({from}, {to}, {n}): {err}"
        );
    }

    // Nothing above touched the caches.
    assert_eq!(
        (b.cached_len(0), b.cached_len(1), b.cached_len(4)),
        (Some(4), Some(6), None)
    );
    h.pass(0, &[(4, tokens(5, 2, v)), (6, tokens(6, 3, v))], 3);
}

#[test]
fn wrong_layouts_and_options_are_refused_by_name() {
    let Some((lib, gqa, batched)) = env_paths() else {
        return;
    };
    let opts = options(&lib, L);
    let Err(err) = BatchedOrtBackend::new(&gqa, &opts, 2) else {
        panic!("a GQA model must be refused");
    };
    assert!(
        matches!(err, SpecError::ModelFormat(ref m) if m.contains("shared_buffer") && m.contains("--attention batched")),
        "{err}"
    );
    let Err(err) = OrtBackend::new(&batched, &opts) else {
        panic!("OrtBackend must refuse the batched contract");
    };
    assert!(
        matches!(err, SpecError::ModelFormat(ref m) if m.contains("batched")),
        "{err}"
    );
    for max_batch in [0, 65] {
        let Err(err) = BatchedOrtBackend::new(&batched, &opts, max_batch) else {
            panic!("max_batch {max_batch} must be refused");
        };
        assert!(
            matches!(err, SpecError::Setting { ref field, ref message } if field == "max_batch" && message.contains(&format!("max_batch {max_batch}")) && message.contains("64")),
            "{err}"
        );
    }
    let mut cuda = opts.clone();
    cuda.provider = Provider::Cuda;
    let Err(err) = BatchedOrtBackend::new(&batched, &cuda, 2) else {
        panic!("CUDA must be refused");
    };
    assert!(
        matches!(err, SpecError::Provider(ref m) if m.contains("CPU provider only")),
        "{err}"
    );
    cuda.allow_fallback = true;
    let backend = BatchedOrtBackend::new(&batched, &cuda, 2).unwrap();
    assert_eq!(backend.provider(), Provider::Cpu);
    assert!(backend
        .fallback_reason()
        .unwrap()
        .contains("CPU provider only"));
}

/// The batched test model is converted with `prefill_graph=True` (`make test-rs`): with
/// `OrtOptions::prefill_graph` a pass of at least `prefill_min_tokens` tokens per row runs on `prefill.onnx` (its
/// logits equal the prefill graph's own, bit for bit, and differ from the main graph's: int8 matrices), a shorter one
/// on `model.onnx`; without the option the prefill graph is never loaded.
#[test]
fn long_passes_run_on_the_prefill_graph_when_asked() {
    let Some((lib, _, batched)) = env_paths() else {
        return;
    };
    let with = BatchedOrtBackend::new(
        &batched,
        &OrtOptions {
            prefill_graph: true,
            ..options(&lib, L)
        },
        1,
    )
    .unwrap();
    let min = with.prefill_graph().expect(
        "the test model has a prefill graph (make test-rs converts it with prefill_graph=True)",
    );
    assert_eq!(min, 16);
    let main = BatchedOrtBackend::new(&batched, &options(&lib, L), 1).unwrap();
    assert_eq!(main.prefill_graph(), None, "not loaded without the option");
    let prefill_only =
        BatchedOrtBackend::new(batched.join("prefill.onnx"), &options(&lib, L), 1).unwrap();
    let mut models = [with, main, prefill_only];
    let vocab = models[0].vocab_size();
    for n in [min - 1, min, min + 5] {
        let toks = tokens(7, n, vocab);
        let row = [BatchRow {
            tokens: &toks,
            n_past: 0,
        }];
        let out: Vec<Vec<f32>> = models
            .iter_mut()
            .map(|m| m.forward_rows(0, &row, 2).unwrap().to_vec())
            .collect();
        let diff = out[1]
            .iter()
            .zip(&out[2])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            diff > 0.0,
            "the two graphs compute the same logits: the test could not tell them apart"
        );
        if n >= min {
            assert_eq!(
                out[0], out[2],
                "{n} tokens: expected the prefill graph's logits"
            );
        } else {
            assert_eq!(
                out[0], out[1],
                "{n} tokens: expected the main graph's logits"
            );
        }
    }
    // Decode steps after a prefill-graph pass run on the main graph and read the cache that pass wrote.
    let toks = tokens(9, 1, vocab);
    let step = [BatchRow {
        tokens: &toks,
        n_past: min + 5,
    }];
    let a = models[0].forward_rows(0, &step, 1).unwrap().to_vec();
    let c = models[2].forward_rows(0, &step, 1).unwrap().to_vec();
    assert_ne!(a, c, "a 1-token step ran on the prefill graph");
}

/// A config naming a prefill graph that is not there is an I/O error naming the file (only when it is asked for).
#[test]
fn a_missing_prefill_graph_is_an_error_naming_it() {
    let Some((lib, _, batched)) = env_paths() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("specrt-prefill-missing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["model.onnx", "model.onnx.data"] {
        std::fs::copy(batched.join(f), dir.join(f)).unwrap();
    }
    let cfg = std::fs::read_to_string(batched.join("specrt_config.json")).unwrap();
    let cfg = cfg.replace("\"prefill.onnx\"", "\"gone.onnx\"");
    assert!(cfg.contains("gone.onnx"));
    std::fs::write(dir.join("specrt_config.json"), cfg).unwrap();
    let err = BatchedOrtBackend::new(
        &dir,
        &OrtOptions {
            prefill_graph: true,
            ..options(&lib, L)
        },
        1,
    )
    .err()
    .expect("a missing prefill graph must be refused");
    assert!(matches!(err, SpecError::NotFound(_)), "{err}");
    assert!(err.to_string().contains("gone.onnx"), "{err}");
    // Not asked for: the model loads.
    BatchedOrtBackend::new(&dir, &options(&lib, L), 1).unwrap();
    std::fs::remove_dir_all(&dir).ok();
}

/// Prefix caching in the batched engine on the real model: kept prefixes copied out of finished rows' slots and
/// into joining rows' slots give the tokens an engine without prefix caching gives (greedy and coupled sampling,
/// the model as its own draft on its prefill graph), with requests one at a time (a chat continuation, a prefix
/// of a kept sequence) and a wave sharing a long first part; a tiny budget keeps nothing and changes nothing.
#[test]
fn batched_prefix_caching_gives_the_tokens_of_a_full_prefill() {
    use specrt_core::{
        BatchEngine, BatchOptions, GenerationConfig, GenerationOutput, SamplingParams,
    };
    let Some((lib, _, batched)) = env_paths() else {
        return;
    };
    let engine = |opts: BatchOptions| {
        let t = BatchedOrtBackend::new(&batched, &options(&lib, 128), 3).unwrap();
        let d = BatchedOrtBackend::new(&batched, &options(&lib, 128).for_draft(), 3).unwrap();
        BatchEngine::new(
            Box::new(t),
            Some(Box::new(d)),
            BatchOptions {
                prefill_chunk: 16,
                ..opts
            },
        )
        .unwrap()
    };
    let run = |e: &mut BatchEngine,
               reqs: &[(u64, Vec<u32>, GenerationConfig)]|
     -> Vec<GenerationOutput> {
        for (id, p, c) in reqs {
            e.add(*id, p, c.clone()).unwrap();
        }
        while !e.is_idle() {
            for r in e.step().unwrap() {
                assert!(r.error.is_none(), "{:?}", r.error);
            }
        }
        reqs.iter()
            .map(|(id, _, _)| e.take_output(*id).unwrap())
            .collect()
    };
    let mut cached = engine(BatchOptions::default());
    let mut fresh = engine(BatchOptions {
        prefix_caching: false,
        ..BatchOptions::default()
    });
    let mut tiny = engine(BatchOptions {
        prefix_cache_bytes: 1,
        ..BatchOptions::default()
    });
    let vocab = cached.vocab_size() as u32;
    let seq = |seed: u32, n: u32| -> Vec<u32> { (0..n).map(|i| (i * 37 + seed) % vocab).collect() };
    let greedy = GenerationConfig {
        max_new_tokens: 10,
        num_speculative_tokens: 3,
        sampling: SamplingParams::greedy(),
        ..GenerationConfig::default()
    };
    let coupled = GenerationConfig {
        sampling: SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        },
        coupled: true,
        seed: 9,
        ..greedy.clone()
    };
    let mut id = 0;
    let mut hits = 0;
    for cfg in [&greedy, &coupled] {
        let mut prev = seq(5, 20);
        for turn in 0..3 {
            let p = match turn {
                0 => prev.clone(),
                1 => [&prev[..], &seq(7, 8)[..]].concat(),
                _ => prev[..15].to_vec(),
            };
            id += 1;
            let req = [(id, p.clone(), cfg.clone())];
            let a = run(&mut cached, &req).remove(0);
            let b = run(&mut fresh, &req).remove(0);
            let c = run(&mut tiny, &req).remove(0);
            assert_eq!(a.tokens, b.tokens, "turn {turn}");
            assert_eq!(c.tokens, b.tokens, "turn {turn}, tiny budget");
            assert_eq!((b.stats.n_cached_tokens, c.stats.n_cached_tokens), (0, 0));
            hits += usize::from(a.stats.prefix_cache_hit());
            prev = [&p[..], &a.tokens[..]].concat();
        }
        // A wave of three sharing a 30-token first part, after one that kept it.
        let shared = seq(11, 30);
        let wave: Vec<_> = (0..4u32)
            .map(|q| {
                id += 1;
                (id, [&shared[..], &seq(q + 1, 5)[..]].concat(), cfg.clone())
            })
            .collect();
        run(&mut cached, &wave[..1]);
        let a = run(&mut cached, &wave[1..]);
        let b = run(&mut fresh, &wave[1..]);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.tokens, y.tokens);
            assert!(x.stats.n_cached_tokens >= 30, "{}", x.stats.n_cached_tokens);
        }
    }
    assert!(hits >= 4, "{hits} hits");
    assert_eq!(tiny.prefix_cache_usage(), (0, 0));
}
