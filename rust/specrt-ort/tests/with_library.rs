//! Tests that need the ONNX Runtime library and a tiny model. They run only when `SPECRT_ORT_LIBRARY` (absolute
//! path of libonnxruntime.so.1.x) and `SPECRT_TEST_MODEL` (a contract-layout model folder, e.g. built by
//! `tests/fixtures/tiny_decoders.py`) are set; otherwise they return early. The full suite is `tests/engine/test_ort_backend.py`.

use std::path::PathBuf;

use specrt_core::{backend::Backend, SpecError};
use specrt_ort::{check_cuda_provider, KvLayout, OrtBackend, OrtOptions, Provider};

fn env_paths() -> Option<(PathBuf, PathBuf)> {
    Some((
        std::env::var_os("SPECRT_ORT_LIBRARY")?.into(),
        std::env::var_os("SPECRT_TEST_MODEL")?.into(),
    ))
}

#[test]
fn chunked_prefill_and_rollback_match_full_prefill() {
    let Some((lib, model)) = env_paths() else {
        return;
    };
    let mut options = OrtOptions::new(&lib);
    options.max_seq_len = Some(32);
    let mut backend = OrtBackend::new(&model, &options).unwrap();
    assert_eq!(backend.layout(), KvLayout::SharedBuffer);
    let vocab = backend.vocab_size();
    let tokens: Vec<u32> = (0..12).map(|i| (i * 7 + 3) % vocab as u32).collect();
    let full = backend.forward(&tokens, 0, 12).unwrap().to_vec();
    let kv = backend.kv_buffer_addresses();

    backend.forward(&tokens[..7], 0, 1).unwrap();
    backend.forward(&[1, 2, 3], 7, 3).unwrap(); // later rejected
    let tail = backend.forward(&tokens[7..], 7, 5).unwrap().to_vec();
    let max_err = full[7 * vocab..]
        .iter()
        .zip(&tail)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(max_err < 1e-4, "max |err| {max_err}");
    assert_eq!(
        kv,
        backend.kv_buffer_addresses(),
        "KV buffers must never be reallocated"
    );

    let err = backend.forward(&tokens, 25, 1).unwrap_err();
    assert!(
        matches!(err, SpecError::Length(ref m) if m.contains("32")),
        "{err}"
    );
}

/// The graph form (`--attention gqa-graph`, `SPECRT_TEST_GRAPH_MODEL`, converted from the same GGUF as
/// `SPECRT_TEST_MODEL`) gives the default form's logits through prefill, a multi-token step, a rollback and 1-token
/// steps, and `forward_argmax` returns the first maximum of each row from the graph's `argmax` output without
/// writing the host logits.
#[test]
fn graph_form_matches_the_default_form_and_returns_argmax_ids() {
    let (Some((lib, model)), Some(graph)) =
        (env_paths(), std::env::var_os("SPECRT_TEST_GRAPH_MODEL"))
    else {
        return;
    };
    let mut options = OrtOptions::new(&lib);
    options.max_seq_len = Some(48);
    let mut want = OrtBackend::new(&model, &options).unwrap();
    // The graph's argmax output is read on the CUDA provider by default; here it is forced on the CPU.
    options.device_argmax = Some(true);
    let mut got = OrtBackend::new(PathBuf::from(graph), &options).unwrap();
    let io = got.decoder_io();
    assert!(io.has_sequence_inputs && io.has_logits_index && io.has_argmax);
    assert!(!want.decoder_io().has_argmax);
    let vocab = want.vocab_size();
    assert_eq!(got.vocab_size(), vocab);
    let toks = |n: usize, salt: usize| -> Vec<u32> {
        (0..n).map(|i| ((i * 7 + salt) % vocab) as u32).collect()
    };
    // (tokens, n_past, n_logits): prefill, a 4-token step, a rollback to 9 with 3 tokens, 1-token steps.
    let steps = [
        (toks(10, 3), 0, 1),
        (toks(4, 5), 10, 4),
        (toks(3, 11), 9, 3),
        (toks(1, 2), 12, 1),
        (toks(1, 9), 13, 1),
    ];
    let mut ids = Vec::new();
    for (i, (tokens, n_past, n)) in steps.iter().enumerate() {
        let a = want.forward(tokens, *n_past, *n).unwrap().to_vec();
        if i % 2 == 0 {
            // Argmax only: the host logits tensor is never written (none was bound before the first such call).
            let before = got.logits_address();
            got.forward_argmax(tokens, *n_past, *n, &mut ids).unwrap();
            assert_eq!(got.logits_address(), before);
            let mut expected = Vec::new();
            specrt_core::sampling::argmax_rows(&a, vocab, &mut expected).unwrap();
            assert_eq!(ids, expected, "step {i}");
        } else {
            let b = got.forward(tokens, *n_past, *n).unwrap();
            let max_err = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(max_err < 1e-4, "step {i}: max |err| {max_err}");
        }
    }
    assert!(got.logits_address() != 0, "forward bound the host logits");
    // Argmax-only calls back to back with different row counts (each leaves its logits on the device).
    for (tokens, n_past, n) in [
        (toks(3, 4), 14, 3),
        (toks(2, 6), 17, 1),
        (toks(1, 8), 19, 1),
    ] {
        let a = want.forward(&tokens, n_past, n).unwrap().to_vec();
        got.forward_argmax(&tokens, n_past, n, &mut ids).unwrap();
        let mut expected = Vec::new();
        specrt_core::sampling::argmax_rows(&a, vocab, &mut expected).unwrap();
        assert_eq!(ids, expected, "{n} rows after {n_past}");
    }
}

/// On the CPU provider a graph-form model's `forward_argmax` scans the logits by default, so NaN logits are still
/// an error; with the device argmax forced they are not seen.
#[test]
fn on_the_cpu_argmax_ids_come_from_checked_logits_by_default() {
    let (Some((lib, _)), Some(graph)) = (env_paths(), std::env::var_os("SPECRT_TEST_GRAPH_MODEL"))
    else {
        return;
    };
    let mut options = OrtOptions::new(&lib);
    options.max_seq_len = Some(16);
    let mut backend = OrtBackend::new(PathBuf::from(&graph), &options).unwrap();
    let mut ids = Vec::new();
    backend.forward_argmax(&[1, 2, 3], 0, 2, &mut ids).unwrap();
    assert_ne!(
        backend.logits_address(),
        0,
        "the default path reads the logits"
    );
    let vocab = backend.vocab_size();
    let mut want = Vec::new();
    specrt_core::sampling::argmax_rows(
        backend.forward(&[1, 2, 3], 0, 2).unwrap(),
        vocab,
        &mut want,
    )
    .unwrap();
    assert_eq!(ids, want);
}

#[test]
fn cuda_graph_needs_the_cuda_provider() {
    let Some((lib, model)) = env_paths() else {
        return;
    };
    let mut options = OrtOptions::new(&lib);
    options.cuda_graph = true;
    let err = OrtBackend::new(&model, &options).err().unwrap();
    assert!(
        matches!(err, SpecError::Setting { ref field, ref message }
            if field == "cuda_graph" && message.contains("cuda_graph needs provider 'cuda' (got provider 'cpu')")),
        "{err}"
    );
}

#[test]
fn cuda_on_the_cpu_wheel_is_a_provider_error() {
    let Some((lib, model)) = env_paths() else {
        return;
    };
    if lib
        .with_file_name(specrt_ort::CUDA_PROVIDER_LIBRARY)
        .exists()
    {
        return; // GPU wheel: covered by the gpu tests
    }
    let err = check_cuda_provider(&lib, 0).unwrap_err();
    assert!(
        matches!(err, SpecError::Provider(ref m) if m.contains("libonnxruntime_providers_cuda.so")),
        "{err}"
    );
    let mut options = OrtOptions::new(&lib);
    options.provider = Provider::Cuda;
    assert!(matches!(
        OrtBackend::new(&model, &options),
        Err(SpecError::Provider(_))
    ));
    options.allow_fallback = true;
    let backend = OrtBackend::new(&model, &options).unwrap();
    assert_eq!(backend.provider(), Provider::Cpu);
    assert!(backend.fallback_reason().unwrap().contains("CUDA"));
    // Asked-for CUDA graphs fall back with the provider (the caller allowed it) and the reason says so; a model
    // that CUDA graphs could not run is refused even then.
    options.cuda_graph = true;
    let err = OrtBackend::new(&model, &options).err().unwrap();
    assert!(
        matches!(err, SpecError::Setting { ref field, ref message } if field == "cuda_graph" && message.contains("gqa-graph")),
        "{err}"
    );
    if let Some(graph) = std::env::var_os("SPECRT_TEST_GRAPH_MODEL") {
        let backend = OrtBackend::new(PathBuf::from(graph), &options).unwrap();
        assert_eq!(backend.provider(), Provider::Cpu);
        assert!(backend
            .fallback_reason()
            .unwrap()
            .contains("cuda_graph is off"));
    }
}

/// Per-call time of a 1-token decode step in Rust alone (no Python). Run with
/// `cargo test --release -p specrt-ort --test with_library -- --ignored --nocapture` and the env vars above.
#[test]
#[ignore = "timing; run explicitly"]
fn decode_step_time() {
    let Some((lib, model)) = env_paths() else {
        return;
    };
    let mut options = OrtOptions::new(&lib);
    options.max_seq_len = Some(64);
    options.intra_op_threads =
        Some(std::env::var("SPECRT_THREADS").map_or(2, |v| v.parse().unwrap()));
    let mut backend = OrtBackend::new(&model, &options).unwrap();
    let vocab = backend.vocab_size() as u32;
    let tokens: Vec<u32> = (0..33).map(|i| (i * 7 + 3) % vocab).collect();
    backend.forward(&tokens[..32], 0, 1).unwrap();
    for _ in 0..200 {
        backend.forward(&tokens[32..], 32, 1).unwrap();
    }
    let calls = 3000;
    let t0 = std::time::Instant::now();
    for _ in 0..calls {
        backend.forward(&tokens[32..], 32, 1).unwrap();
    }
    let per_call_us = t0.elapsed().as_secs_f64() / f64::from(calls) * 1e6;
    println!("decode step (vocab {vocab}): {per_call_us:.1} us/call");
}

/// The test model is converted with `prefill_graph=True` (`make test-rs`): with `OrtOptions::prefill_graph` a pass of
/// at least `prefill_min_tokens` tokens runs on `prefill.onnx` (its logits equal the prefill graph's own, bit for
/// bit, and differ from the main graph's), a shorter pass and every later step on `model.onnx`, over one KV cache
/// (the steps read what the prefill graph wrote); without the option it is never loaded.
#[test]
fn long_passes_run_on_the_prefill_graph_when_asked() {
    let Some((lib, model)) = env_paths() else {
        return;
    };
    let options = |prefill_graph: bool| {
        let mut o = OrtOptions::new(&lib);
        o.max_seq_len = Some(64);
        o.prefill_graph = prefill_graph;
        o
    };
    let mut with = OrtBackend::new(&model, &options(true)).unwrap();
    let min = with.prefill_graph().expect(
        "the test model has a prefill graph (make test-rs converts it with prefill_graph=True)",
    );
    let mut main = OrtBackend::new(&model, &options(false)).unwrap();
    assert_eq!(main.prefill_graph(), None, "not loaded without the option");
    let mut pre = OrtBackend::new(model.join("prefill.onnx"), &options(false)).unwrap();
    let vocab = with.vocab_size();
    let tokens: Vec<u32> = (0..min + 6)
        .map(|i| (i as u32 * 7 + 3) % vocab as u32)
        .collect();
    let kv = with.kv_buffer_addresses();
    for n in [min - 1, min] {
        let a = with.forward(&tokens[..n], 0, 2).unwrap().to_vec();
        let b = main.forward(&tokens[..n], 0, 2).unwrap().to_vec();
        let c = pre.forward(&tokens[..n], 0, 2).unwrap().to_vec();
        assert_ne!(
            b, c,
            "the two graphs compute the same logits: the test could not tell them apart"
        );
        if n >= min {
            assert_eq!(a, c, "{n} tokens: expected the prefill graph's logits");
        } else {
            assert_eq!(a, b, "{n} tokens: expected the main graph's logits");
        }
    }
    // Steps after a prefill-graph pass run on the model over the cache that pass wrote: as the prefill-only
    // backend's cache would give with the model's weights, i.e. a model step on top of the prefill graph's KV. Its
    // logits differ from both single-graph backends' and stay close to them.
    let a = with
        .forward(&tokens[min..min + 2], min, 2)
        .unwrap()
        .to_vec();
    let b = main
        .forward(&tokens[min..min + 2], min, 2)
        .unwrap()
        .to_vec();
    let c = pre.forward(&tokens[min..min + 2], min, 2).unwrap().to_vec();
    assert_ne!(a, c, "a 2-token step ran on the prefill graph");
    assert_ne!(a, b, "the step did not read the prefill graph's cache");
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let gap = a
        .iter()
        .zip(&b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(gap < 0.5 * scale, "gap {gap} at logit scale {scale}");
    assert_eq!(
        with.kv_buffer_addresses(),
        kv,
        "one KV cache for both graphs"
    );
}

/// The CUDA-graph steps in their CPU mode (`OrtOptions::cpu_graph_steps`: the same fixed-address step bindings, the
/// replay invariants checked before every step) in speculative rounds: a graph-form target with a 1-layer
/// graph-form draft (`SPECRT_TEST_GRAPH_DRAFT`), K = 1, 4 and 8, greedy with log-probabilities off (argmax-only
/// steps) and on, and sampled at T = 1, all on one pair of models (device KV reused between generations, rollbacks
/// after rejections, the draft's 2-token catch-up after a fully accepted round). Greedy: the default form's
/// target-only tokens; sampled: the same tokens as the graph form without graph steps (same seed, same kernels).
#[test]
fn cpu_graph_steps_give_the_default_forms_tokens_in_speculative_rounds() {
    use specrt_core::{sampling::SamplingParams, Engine, GenerationConfig};
    let (Some((lib, model)), Some(graph), Some(graph_draft)) = (
        env_paths(),
        std::env::var_os("SPECRT_TEST_GRAPH_MODEL"),
        std::env::var_os("SPECRT_TEST_GRAPH_DRAFT"),
    ) else {
        return;
    };
    let mut options = OrtOptions::new(&lib);
    options.max_seq_len = Some(256);
    let load = |path: &std::ffi::OsStr, steps: bool| -> Box<dyn Backend> {
        let mut o = options.clone();
        o.cpu_graph_steps = steps;
        Box::new(OrtBackend::new(PathBuf::from(path), &o).unwrap())
    };
    let prompt: Vec<u32> = (1..=9).collect();
    let cfg = |k: usize, logprobs: bool, temperature: f32| GenerationConfig {
        max_new_tokens: 96,
        num_speculative_tokens: k,
        ignore_eos: true,
        logprobs,
        seed: 11,
        sampling: if temperature == 0.0 {
            SamplingParams::greedy()
        } else {
            SamplingParams {
                temperature,
                ..SamplingParams::default()
            }
        },
        ..GenerationConfig::default()
    };
    let mut reference = Engine::new(load(model.as_os_str(), false), None).unwrap();
    let want = reference
        .generate(&prompt, cfg(0, false, 0.0), |_| true)
        .unwrap();
    let mut plain = Engine::new(load(&graph, false), Some(load(&graph_draft, false))).unwrap();
    let mut stepped = Engine::new(load(&graph, true), Some(load(&graph_draft, true))).unwrap();
    let (mut rejected, mut full_rounds) = (0, 0);
    for k in [1, 4, 8] {
        for logprobs in [false, true] {
            let got = stepped
                .generate(&prompt, cfg(k, logprobs, 0.0), |_| true)
                .unwrap();
            assert_eq!(got.tokens, want.tokens, "K={k} logprobs={logprobs}");
            assert_eq!(got.logprobs.is_empty(), !logprobs);
            rejected += got.stats.n_recovered;
            full_rounds += got.stats.n_bonus;
        }
        let a = plain
            .generate(&prompt, cfg(k, true, 1.0), |_| true)
            .unwrap();
        let b = stepped
            .generate(&prompt, cfg(k, true, 1.0), |_| true)
            .unwrap();
        assert_eq!(a.tokens, b.tokens, "sampled, K={k}");
        for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
            assert!((x - y).abs() < 1e-4, "sampled, K={k}: logprob {x} vs {y}");
        }
    }
    // The rounds exercised rejections (rollback) and full acceptance (the draft's catch-up shape).
    assert!(
        rejected > 0 && full_rounds > 0,
        "rejected {rejected}, full rounds {full_rounds}"
    );
    // Prefix caching: a continuation of the last greedy output (the cached prefix reused, a short suffix prefilled,
    // one of them a graph shape), then a prompt that shares only its first tokens (the caches rolled back).
    let continuation: Vec<u32> = prompt
        .iter()
        .chain(&want.tokens[..20])
        .copied()
        .chain([5])
        .collect();
    let branch: Vec<u32> = prompt[..4].iter().copied().chain([7, 7, 8]).collect();
    for (name, p) in [("continuation", continuation), ("branch", branch)] {
        let want = reference
            .generate(&p, cfg(0, false, 0.0), |_| true)
            .unwrap();
        for logprobs in [false, true] {
            let got = stepped
                .generate(&p, cfg(4, logprobs, 0.0), |_| true)
                .unwrap();
            assert_eq!(got.tokens, want.tokens, "{name}, logprobs={logprobs}");
        }
    }
}

/// Sessions loaded on several threads at once: each registers specrt's operator domain with ONNX Runtime while
/// loading, and ONNX Runtime's registry of domains is not safe to grow from two loads at a time ("Trying to add a
/// domain to DomainToVersion map, but the domain is already exist", seen once in `make test-rs`; `build_session`
/// now loads one session at a time). Every load must succeed, in rounds of 8 threads. (The race is rare: this test
/// did not reproduce it before the lock on a 2-core machine, so it guards the lock's path, not the race itself.)
#[test]
fn sessions_load_on_many_threads_at_once() {
    let Some((lib, model)) = env_paths() else {
        return;
    };
    let mut options = OrtOptions::new(&lib);
    options.max_seq_len = Some(16);
    options.intra_op_threads = Some(1);
    for round in 0..6 {
        let errors: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        OrtBackend::new(&model, &options)
                            .err()
                            .map(|e| e.to_string())
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().expect("a loading thread panicked"))
                .collect()
        });
        assert!(errors.is_empty(), "round {round}: {errors:?}");
    }
}
