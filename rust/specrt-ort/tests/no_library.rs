//! Constructor errors that must come before ONNX Runtime is touched: no library needed, and no panic.

use specrt_core::SpecError;
use specrt_ort::{OrtBackend, OrtOptions, Provider};

#[test]
fn relative_library_path_is_a_setting_error_naming_ort_library() {
    let err = OrtBackend::new("/nonexistent/model", &OrtOptions::new("libonnxruntime.so"))
        .err()
        .unwrap();
    assert_eq!(err.field(), Some("ort_library"), "{err:?}");
    assert!(
        matches!(&err, SpecError::Setting { message, .. } if message.contains("absolute")),
        "{err}"
    );
}

#[test]
fn missing_library_is_a_not_found_error_naming_it() {
    let options = OrtOptions {
        provider: Provider::Cuda,
        ..OrtOptions::new("/nonexistent/libonnxruntime.so.1.32.0")
    };
    let err = OrtBackend::new("/nonexistent/model", &options)
        .err()
        .unwrap();
    assert!(
        matches!(&err, SpecError::NotFound(m) if m.contains("/nonexistent/libonnxruntime.so.1.32.0") && m.contains("not found")),
        "{err}"
    );
}

#[test]
fn invalid_options_are_rejected_first() {
    let options = OrtOptions {
        intra_op_threads: Some(0),
        ..OrtOptions::new("/nonexistent/lib.so")
    };
    let err = OrtBackend::new("/nonexistent/model", &options)
        .err()
        .unwrap();
    assert_eq!(err.field(), Some("intra_op_threads"), "{err:?}");
}
