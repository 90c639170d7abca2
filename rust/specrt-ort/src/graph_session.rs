//! A session over any ONNX file with float32 inputs and outputs, on this process's ONNX Runtime with specrt's
//! operators registered ([`crate::ops`]): how benches and tests run a one-node graph (`GgufMatMul` beside
//! `MatMulNBits`) without a second ONNX Runtime in the process.

use std::path::Path;

use ort::session::Session;
use ort::value::Tensor;
use specrt_core::{Result, SpecError};

use crate::options::{OrtOptions, Provider};
use crate::ort_backend::build_session;
use crate::runtime::{init_runtime_with_threads, ort_err};

/// One output of [`GraphSession::run`]: its name, shape and float32 values (row-major).
#[derive(Debug, Clone)]
pub struct GraphOutput {
    /// The graph output's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<i64>,
    /// Its values, row-major.
    pub values: Vec<f32>,
}

/// A CPU session of one ONNX file (the decoders' session options: optimization level, threads, operators).
pub struct GraphSession {
    session: Session,
}

impl GraphSession {
    /// Open `model` on the CPU with `options` (library, intra-op threads).
    ///
    /// # Errors
    /// As [`crate::init_runtime`]; `SpecError::NotFound` / `ModelFormat` / `Backend` when the file cannot be loaded.
    pub fn open(model: &Path, options: &OrtOptions) -> Result<Self> {
        init_runtime_with_threads(&options.ort_library, options.effective_intra_op_threads())?;
        Ok(Self {
            session: build_session(model, options, Provider::Cpu)?,
        })
    }

    /// Run with float32 `inputs` (`(name, shape, values)`) and return every output, which must be float32.
    ///
    /// # Errors
    /// `SpecError::Shape` when an input's values do not fill its shape; `SpecError::Backend` from ONNX Runtime
    /// (a missing or unknown input, a failing kernel, an output that is not float32).
    pub fn run(&mut self, inputs: &[(String, Vec<i64>, &[f32])]) -> Result<Vec<GraphOutput>> {
        let mut values = Vec::with_capacity(inputs.len());
        for (name, shape, data) in inputs {
            let count: i64 = shape.iter().product();
            if usize::try_from(count).ok() != Some(data.len()) {
                return Err(SpecError::Shape(format!(
                    "input {name:?}: {} values for shape {shape:?} ({count} expected)",
                    data.len()
                )));
            }
            let tensor = Tensor::from_array((shape.clone(), data.to_vec()))
                .map_err(|e| ort_err(name, &e))?;
            values.push((name.clone(), tensor.into_dyn()));
        }
        let outputs = self
            .session
            .run(values)
            .map_err(|e| ort_err("running the graph", &e))?;
        outputs
            .iter()
            .map(|(name, value)| {
                let (shape, data) = value
                    .try_extract_tensor::<f32>()
                    .map_err(|e| ort_err(name, &e))?;
                Ok(GraphOutput {
                    name: name.to_owned(),
                    shape: shape.iter().copied().collect(),
                    values: data.to_vec(),
                })
            })
            .collect()
    }
}
