//! ONNX Runtime's profiler, in a test binary of its own: every session of a process shares one thread pool
//! (`specrt_ort::init_runtime_with_threads`), and starting or ending a session's profiler turns the pool's profiler
//! on or off, so a run on another thread at that moment fails inside ONNX Runtime ("LogStart must pair with
//! LogEnd"). Cargo runs each test binary as its own process, one after another: nothing runs beside this test.
//! Runs only when `SPECRT_ORT_LIBRARY` and `SPECRT_TEST_MODEL` are set (`make test-rs`), like `with_library.rs`.

use std::path::PathBuf;

use specrt_core::{backend::Backend, SpecError};
use specrt_ort::{OrtBackend, OrtOptions};

fn env_paths() -> Option<(PathBuf, PathBuf)> {
    Some((
        std::env::var_os("SPECRT_ORT_LIBRARY")?.into(),
        std::env::var_os("SPECRT_TEST_MODEL")?.into(),
    ))
}

#[test]
fn profiling_writes_a_trace_once_and_checks_its_prefix() {
    let Some((lib, model)) = env_paths() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("specrt-profile-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut options = OrtOptions::new(&lib);
    options.max_seq_len = Some(16);
    options.profile = Some(dir.join("trace"));
    let mut backend = OrtBackend::new(&model, &options).unwrap();
    backend.forward(&[1, 2, 3], 0, 1).unwrap();
    let trace = backend.end_profiling().unwrap();
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(
        text.contains("model_run"),
        "{}",
        &text[..text.len().min(200)]
    );
    let err = backend.end_profiling().unwrap_err();
    assert!(err.to_string().contains("already ended"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
    options.profile = Some(dir.join("trace"));
    let err = OrtBackend::new(&model, &options).err().unwrap();
    assert!(
        matches!(err, SpecError::NotFound(ref m) if m.contains("does not exist")),
        "{err}"
    );
    options.profile = Some(PathBuf::new());
    let err = OrtBackend::new(&model, &options).err().unwrap();
    assert!(
        matches!(err, SpecError::Setting { ref field, ref message } if field == "profile" && message.contains("profile prefix is empty")),
        "{err}"
    );
    options.profile = None;
    let err = OrtBackend::new(&model, &options)
        .unwrap()
        .end_profiling()
        .unwrap_err();
    assert!(err.to_string().contains("profiling is off"), "{err}");
}
