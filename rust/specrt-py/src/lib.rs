//! `specrt._specrt`: the Python extension module. Converts and registers, nothing more.
use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _specrt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
