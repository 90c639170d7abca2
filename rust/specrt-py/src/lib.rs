//! `specrt._specrt`: the Python extension module. Converts and registers, nothing more.
use pyo3::prelude::*;

mod backend;

/// The extension module.
#[pymodule]
fn _specrt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<backend::PyOrtModel>()?;
    Ok(())
}
