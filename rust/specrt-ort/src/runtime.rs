//! Loading the ONNX Runtime shared library (once per process) and mapping `ort` errors to [`SpecError`].
//!
//! `ort` is built with `load-dynamic`: nothing is linked or downloaded at build time, and the library is `dlopen`ed
//! here from an absolute path. Without this, the first `ort` call would read `ORT_DYLIB_PATH` and **panic** if the
//! library is missing, so every constructor calls [`init_runtime`] before touching any other `ort` API.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use specrt_core::{Result, SpecError};

/// File name of the CUDA execution provider library that the `onnxruntime-gpu` wheel puts beside
/// `libonnxruntime.so` (the CPU wheel lacks it).
pub const CUDA_PROVIDER_LIBRARY: &str = "libonnxruntime_providers_cuda.so";

/// The library this process loaded (canonical path), set once.
static LOADED: OnceLock<PathBuf> = OnceLock::new();
/// Serialises first-time loading (ort's own `OnceLock` would silently ignore a second, different path).
static LOAD_LOCK: Mutex<()> = Mutex::new(());

/// Path of the ONNX Runtime library loaded in this process, if any.
pub fn loaded_library() -> Option<&'static Path> {
    LOADED.get().map(PathBuf::as_path)
}

/// Load `libonnxruntime` from `path` (absolute) unless this process already loaded it.
///
/// Errors: [`SpecError::Setting`] (`ort_library`) for a relative path, or when another library file is already
/// loaded (one ONNX Runtime per process); [`SpecError::NotFound`] when the file does not exist;
/// [`SpecError::Backend`] with code `LoadLibrary` when it cannot be loaded or is not ONNX Runtime, and code `LibraryVersion` when it is older than the
/// API this build needs (ONNX Runtime 1.20).
pub fn init_runtime(path: &Path) -> Result<()> {
    init_runtime_with_threads(path, crate::options::physical_cores())
}

/// [`init_runtime`] with the size of the process-wide intra-op thread pool (used by the first call only).
///
/// All sessions share one ONNX Runtime thread pool of `intra_threads` threads: the draft and the target run one
/// after the other, so two per-session pools would only leave one pool's threads spinning on the cores the other
/// needs (on a 2-core machine that costs the active model up to half its compute).
///
/// Errors: as [`init_runtime`].
pub fn init_runtime_with_threads(path: &Path, intra_threads: usize) -> Result<()> {
    if !path.is_absolute() {
        return Err(SpecError::setting(
            "ort_library",
            format!(
            "ONNX Runtime library path {} is not absolute (expected e.g. <site-packages>/onnxruntime/capi/\
             libonnxruntime.so.1.x)",
            path.display()
        )));
    }
    if !path.is_file() {
        return Err(SpecError::NotFound(format!(
            "ONNX Runtime library not found: {} (expected the libonnxruntime.so.1.x shipped in the onnxruntime or \
             onnxruntime-gpu wheel's capi/ folder; set SPECRT_ORT_LIBRARY to override)",
            path.display()
        )));
    }
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let _guard = LOAD_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(loaded) = LOADED.get() {
        if *loaded == canonical {
            return Ok(());
        }
        return Err(SpecError::setting(
            "ort_library",
            format!(
            "ONNX Runtime is already loaded from {} in this process; cannot also load {} (one library per process)",
            loaded.display(),
            path.display()
        )));
    }
    // `ort` panics (an `expect` in its API setup) when a library exports `OrtGetApiBase` and claims a supported
    // version but returns no API table for the version this build asks for: report that as a load error naming
    // the library instead of a panic.
    let init = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ort::init_from(&canonical).map(|builder| {
            // The environment is global too; a second commit would be ignored.
            let pool = ort::environment::GlobalThreadPoolOptions::default()
                .with_intra_threads(intra_threads.max(1))
                .and_then(|p| p.with_inter_threads(1))
                .map_err(|e| ort_err("configuring the global thread pool", &e))?;
            let _ = builder
                .with_name("specrt")
                .with_telemetry(false)
                .with_global_thread_pool(pool)
                .commit();
            Ok(())
        })
    }));
    let Ok(init) = init else {
        return Err(SpecError::Backend {
            code: "LoadLibrary".into(),
            message: format!(
                "{} exports OrtGetApiBase but does not provide the ONNX Runtime C API version {} this build needs \
                 (not a working ONNX Runtime >= 1.{} library)",
                path.display(),
                ort::MINOR_VERSION,
                ort::MINOR_VERSION
            ),
        });
    };
    match init {
        Ok(committed) => {
            committed?;
            let _ = LOADED.set(canonical);
            Ok(())
        }
        Err(err) => Err(match &err {
            ort::LoadDynamicError::BadVersion { version_str, .. } => SpecError::Backend {
                code: "LibraryVersion".into(),
                message: format!(
                    "ONNX Runtime library {} is version {version_str}, too old: specrt needs >= 1.{} ({err})",
                    path.display(),
                    ort::MINOR_VERSION
                ),
            },
            ort::LoadDynamicError::MissingApi { .. } => SpecError::Backend {
                code: "LoadLibrary".into(),
                message: format!(
                    "{} is not an ONNX Runtime library: it does not export OrtGetApiBase",
                    path.display()
                ),
            },
            ort::LoadDynamicError::Dlopen { .. } => SpecError::Backend {
                code: "LoadLibrary".into(),
                message: format!("cannot load the ONNX Runtime library {}: {err}", path.display()),
            },
        }),
    }
}

/// Map an `ort` error to [`SpecError::Backend`]; `context` says what was being done.
pub(crate) fn ort_err<R>(context: &str, err: &ort::Error<R>) -> SpecError {
    SpecError::Backend {
        code: format!("{:?}", err.code()),
        message: format!("{context}: {}", err.message()),
    }
}

/// The CUDA provider library expected beside the loaded ONNX Runtime library.
pub(crate) fn cuda_provider_library_path() -> Option<PathBuf> {
    loaded_library()
        .and_then(Path::parent)
        .map(|dir| dir.join(CUDA_PROVIDER_LIBRARY))
}

/// What the loaded ONNX Runtime library is and offers (for diagnostics and bug reports).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// Canonical path of the loaded `libonnxruntime.so.1.x`.
    pub library: PathBuf,
    /// ONNX Runtime's build information string (`ORT Build Info: git-branch=..., git-commit-id=...`).
    pub build_info: String,
    /// The library's version string (`OrtApiBase::GetVersionString`, e.g. `"1.32.0"`).
    pub version: String,
    /// Execution providers the library was built with, e.g. `["CUDAExecutionProvider", "CPUExecutionProvider"]`.
    /// "Built with" is not "usable": the CUDA provider also needs its library, the driver, the CUDA runtime and
    /// cuDNN (see [`crate::check_cuda_provider`]).
    pub providers: Vec<String>,
}

/// Facts about the library loaded by [`init_runtime`].
///
/// Errors: [`SpecError::Config`] when no library is loaded yet; [`SpecError::Backend`] when ONNX Runtime cannot
/// list its providers.
pub fn runtime_info() -> Result<RuntimeInfo> {
    let Some(library) = loaded_library() else {
        return Err(SpecError::Config(
            "no ONNX Runtime library is loaded in this process (call init_runtime first)".into(),
        ));
    };
    let build_info = ort::info().to_owned();
    let version = library_version(library)?;
    let api = ort::api();
    let mut names: *mut *mut std::ffi::c_char = std::ptr::null_mut();
    let mut count: std::ffi::c_int = 0;
    // SAFETY: valid out pointers; the list is released below with the count ONNX Runtime returned.
    let status = unsafe { (api.GetAvailableProviders)(&raw mut names, &raw mut count) };
    // SAFETY: `status` was just returned by ONNX Runtime.
    unsafe { ort::Error::result_from_status(status) }
        .map_err(|e| ort_err("listing the available execution providers", &e))?;
    let mut providers = Vec::new();
    if !names.is_null() {
        for i in 0..usize::try_from(count).unwrap_or(0) {
            // SAFETY: `names` holds `count` NUL-terminated strings owned by ONNX Runtime.
            let name = unsafe { std::ffi::CStr::from_ptr(*names.add(i)) };
            providers.push(name.to_string_lossy().into_owned());
        }
        // SAFETY: the list and count returned above, released once.
        let status = unsafe { (api.ReleaseAvailableProviders)(names, count) };
        // SAFETY: `status` was just returned by ONNX Runtime.
        unsafe { ort::Error::result_from_status(status) }
            .map_err(|e| ort_err("releasing the provider list", &e))?;
    }
    Ok(RuntimeInfo {
        library: library.to_path_buf(),
        build_info,
        version,
        providers,
    })
}

/// The version string of the ONNX Runtime library this process loaded (e.g. `"1.32.0"`).
///
/// Errors: [`SpecError::Config`] before [`init_runtime`]; [`SpecError::Backend`] when the library cannot say.
pub(crate) fn loaded_version() -> Result<String> {
    let Some(library) = loaded_library() else {
        return Err(SpecError::Config(
            "no ONNX Runtime library is loaded in this process (call init_runtime first)".into(),
        ));
    };
    library_version(library)
}

/// The version string of the ONNX Runtime library at `path` (already loaded: `dlopen` returns the same handle).
fn library_version(path: &Path) -> Result<String> {
    let load_err = |what: &str, e: libloading::Error| SpecError::Backend {
        code: "LoadLibrary".into(),
        message: format!("{what} {}: {e}", path.display()),
    };
    // SAFETY: the library is ONNX Runtime, already loaded and initialised by `init_runtime`; loading it again only
    // takes a reference on the same handle, and `OrtGetApiBase` has the C signature declared here.
    unsafe {
        let lib = libloading::Library::new(path).map_err(|e| load_err("loading", e))?;
        let get_base: libloading::Symbol<
            '_,
            unsafe extern "C" fn() -> *const ort::sys::OrtApiBase,
        > = lib
            .get(b"OrtGetApiBase")
            .map_err(|e| load_err("resolving OrtGetApiBase in", e))?;
        let base = get_base();
        if base.is_null() {
            return Err(SpecError::Backend {
                code: "LoadLibrary".into(),
                message: format!("OrtGetApiBase returned null in {}", path.display()),
            });
        }
        let version = ((*base).GetVersionString)();
        Ok(std::ffi::CStr::from_ptr(version)
            .to_string_lossy()
            .into_owned())
    }
}
