//! specrt-ort: the ONNX Runtime backend of specrt (ort crate with `load-dynamic`).
