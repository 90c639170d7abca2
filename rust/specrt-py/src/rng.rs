//! Python wrapper of `specrt_core::rng`: `Rng`, the seeded PCG64 stream the sampling functions advance.

use pyo3::prelude::*;
use specrt_core::rng::PcgState;
use specrt_core::Rng;

use crate::errors::to_pyerr;

/// A seeded PCG64 random stream, the twin of `numpy.random.PCG64` (see `specrt.reference_sampling.numpy_generator`).
///
/// Passed as `rng=` to `sample` / `sample_draft` / `verify`, it is advanced in place, so successive calls continue
/// one stream.
#[pyclass(module = "specrt._specrt", name = "Rng")]
#[derive(Clone)]
pub struct PyRng {
    pub(crate) inner: Rng,
}

#[pymethods]
impl PyRng {
    /// Create a stream from a 64-bit seed (splitmix64 -> `rand_pcg::Pcg64::new`, reproduced by
    /// `specrt.reference_sampling.pcg_state_from_seed`).
    ///
    /// Args:
    ///     seed: integer in [0, 2**64).
    #[new]
    #[pyo3(text_signature = "(seed)")]
    fn new(seed: u64) -> Self {
        Self {
            inner: Rng::seed_from_u64(seed),
        }
    }

    /// Create a stream at an exact PCG64 state.
    ///
    /// Args:
    ///     state: 128-bit LCG state.
    ///     inc: 128-bit odd increment.
    ///
    /// Raises:
    ///     ConfigError: `inc` is even.
    #[staticmethod]
    #[pyo3(text_signature = "(state, inc)")]
    fn from_state(state: u128, inc: u128) -> PyResult<Self> {
        Ok(Self {
            inner: Rng::from_state(PcgState { state, inc }).map_err(to_pyerr)?,
        })
    }

    /// The current `(state, inc)`; NumPy's `PCG64.state["state"]` takes them as `{"state": .., "inc": ..}`.
    #[getter]
    fn state(&self) -> (u128, u128) {
        let s = self.inner.state();
        (s.state, s.inc)
    }

    /// Next raw 64-bit output (NumPy `PCG64.random_raw()`).
    fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// Next uniform float in [0, 1) (NumPy `Generator(PCG64).random()`).
    fn random(&mut self) -> f64 {
        self.inner.next_f64()
    }

    /// An independent copy at the same state (a checkpoint).
    fn copy(&self) -> Self {
        self.clone()
    }

    fn __repr__(&self) -> String {
        let s = self.inner.state();
        format!("Rng(state=0x{:032x}, inc=0x{:032x})", s.state, s.inc)
    }
}
