//! Tests that need the ONNX Runtime library and a tiny model. They run only when `SPECRT_ORT_LIBRARY` (absolute
//! path of libonnxruntime.so.1.x) and `SPECRT_TEST_MODEL` (a contract-layout model folder, e.g. built by
//! `tests/fixtures/tiny_decoders.py`) are set; otherwise they return early. The full suite is `tests/test_ort_backend.py`.

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
