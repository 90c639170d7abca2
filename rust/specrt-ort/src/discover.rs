//! Finding `libonnxruntime.so`: [`find_ort_library`] (a Rust program) and [`find_ort_library_in_package`] (the
//! Python package, through `specrt._ort.find_ort_library`): one search for both.
//!
//! `specrt-ort` builds `ort` with `load-dynamic`: nothing is linked at build time, and
//! [`crate::OrtOptions::ort_library`] must name the library file at run time. [`find_ort_library`] looks in this
//! order and returns the first hit (the Python package's search is the same, with step 4 the wheel of the running
//! interpreter, whose package folder it passes, and no explicit path):
//!
//! 1. the explicit path (a `--ort-library` flag), if given;
//! 2. `$SPECRT_ORT_LIBRARY` ([`ORT_LIBRARY_ENV`]);
//! 3. `$ORT_DYLIB_PATH` ([`ORT_DYLIB_PATH_ENV`], the variable the `ort` crate itself reads);
//! 4. the copy inside the `onnxruntime` / `onnxruntime-gpu` wheel of a Python interpreter: the newest
//!    `capi/libonnxruntime.so.1*` of the package folder, found with `importlib.util.find_spec` (onnxruntime is
//!    not imported). The interpreter is `$SPECRT_PYTHON` ([`PYTHON_ENV`]) alone when it is set; otherwise the first
//!    of these that has the wheel: the active virtual environment's (`$VIRTUAL_ENV/bin/python`), the
//!    `.venv/bin/python` of the current folder or the nearest folder above it (the one `make install` makes in a
//!    checkout, so `cargo run` there finds it), then `python3` on `PATH` ([`python_candidates`]);
//! 5. a system install: the newest `libonnxruntime.so*` in one of [`SYSTEM_LIBRARY_DIRS`].
//!
//! A path given in steps 1-3 must exist: a wrong setting is an error naming it, never silently skipped. Empty
//! variables count as unset. Linux file names only (`.so`).

use std::path::{Path, PathBuf};
use std::process::Command;

use specrt_core::{Result, SpecError};

/// Environment variable naming the library file (the one the Python package reads too).
pub const ORT_LIBRARY_ENV: &str = "SPECRT_ORT_LIBRARY";
/// Environment variable of the `ort` crate naming the library file (honoured after [`ORT_LIBRARY_ENV`]).
pub const ORT_DYLIB_PATH_ENV: &str = "ORT_DYLIB_PATH";
/// Environment variable naming the Python interpreter whose onnxruntime wheel is searched (when unset: the
/// interpreters of [`python_candidates`]).
pub const PYTHON_ENV: &str = "SPECRT_PYTHON";
/// The virtual environment folder of an activated venv (set by its `activate` script).
pub const VIRTUAL_ENV_ENV: &str = "VIRTUAL_ENV";
/// Folders searched for a system install of ONNX Runtime, in order (release tarballs unpacked into
/// `/opt/onnxruntime`, or copied into the usual library folders).
pub const SYSTEM_LIBRARY_DIRS: [&str; 4] = [
    "/usr/local/lib",
    "/usr/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/opt/onnxruntime/lib",
];

/// What to run to print the onnxruntime package folder without importing onnxruntime (importing it would load
/// the wheel's copy of the library into that interpreter, which is harmless there but slow).
const FIND_SPEC_SCRIPT: &str = "import importlib.util as u\n\
s = u.find_spec('onnxruntime')\n\
print(next(iter(s.submodule_search_locations)) if s is not None and s.submodule_search_locations else '')";

/// The absolute path of `libonnxruntime.so` to put in [`crate::OrtOptions::ort_library`].
///
/// `explicit` is a path the user gave (e.g. `--ort-library`); relative paths are resolved against the current
/// directory and a leading `~/` against `$HOME`. See the [module docs](self) for the search order.
///
/// Errors: [`SpecError::NotFound`] when an explicit path or a set variable names no file (naming it and where it came
/// from), or when nothing is found; that message lists every place searched and how to install ONNX Runtime
/// (`pip install onnxruntime`, `pip install 'onnxruntime-gpu[cuda,cudnn]'`, or pass `--ort-library`).
pub fn find_ort_library(explicit: Option<&Path>) -> Result<PathBuf> {
    let dirs: Vec<PathBuf> = SYSTEM_LIBRARY_DIRS.iter().map(PathBuf::from).collect();
    find_in(explicit, &dirs, wheel_library, RUST_INSTALL)
}

/// How a Rust program gets ONNX Runtime (the end of the "not found" message of [`find_ort_library`]).
const RUST_INSTALL: &str = "Install it with `pip install onnxruntime` (CPU) or `pip install \
                            'onnxruntime-gpu[cuda,cudnn]'` (CUDA), or pass --ort-library PATH (or set \
                            SPECRT_ORT_LIBRARY) to the absolute path of libonnxruntime.so.1.x";

/// The search of [`find_ort_library`] for a caller that is itself a Python interpreter (the binding): no explicit
/// path, and step 4 is the wheel whose package folder `package` is (the running interpreter's `onnxruntime`, found
/// without importing it; `None`: not installed). `install` ends the "not found" message (how to install ONNX
/// Runtime for that caller, e.g. specrt's extras).
///
/// Errors: as [`find_ort_library`].
pub fn find_ort_library_in_package(package: Option<&Path>, install: &str) -> Result<PathBuf> {
    let dirs: Vec<PathBuf> = SYSTEM_LIBRARY_DIRS.iter().map(PathBuf::from).collect();
    let wheel = || match package {
        None => Err(vec![
            "the onnxruntime wheel of this interpreter: onnxruntime is not installed".to_owned(),
        ]),
        Some(p) => {
            let capi = p.join("capi");
            newest_matching(&capi, "libonnxruntime.so.1").ok_or_else(|| {
                vec![format!(
                    "the onnxruntime wheel of this interpreter: no libonnxruntime.so.1* in {} (a broken or \
                     unusual onnxruntime install?)",
                    capi.display()
                )]
            })
        }
    };
    find_in(None, &dirs, wheel, install)
}

/// [`find_ort_library`] with the system folders, the wheel search and the install advice as parameters (tests
/// use temporary folders).
fn find_in(
    explicit: Option<&Path>,
    system_dirs: &[PathBuf],
    wheel: impl FnOnce() -> std::result::Result<PathBuf, Vec<String>>,
    install: &str,
) -> Result<PathBuf> {
    let mut searched = Vec::new();
    match explicit {
        Some(p) => return existing_file(p, "--ort-library (explicit path)"),
        None => searched.push("--ort-library (explicit path): not given".to_owned()),
    }
    for var in [ORT_LIBRARY_ENV, ORT_DYLIB_PATH_ENV] {
        match std::env::var_os(var).filter(|v| !v.is_empty()) {
            Some(v) => return existing_file(Path::new(&v), &format!("${var}")),
            None => searched.push(format!("${var}: unset")),
        }
    }
    match wheel() {
        Ok(path) => return Ok(path),
        Err(why) => searched.extend(why),
    }
    for dir in system_dirs {
        match newest_matching(dir, "libonnxruntime.so") {
            Some(path) => return Ok(path),
            None => searched.push(format!("{}/libonnxruntime.so*: none", dir.display())),
        }
    }
    Err(SpecError::NotFound(format!(
        "ONNX Runtime library (libonnxruntime.so) not found. Searched, in order:\n  - {}\n{install}",
        searched.join("\n  - ")
    )))
}

/// `path` made absolute if it is a file; otherwise an error naming it and `origin`.
fn existing_file(path: &Path, origin: &str) -> Result<PathBuf> {
    let expanded = match (path.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => Path::new(&home).join(rest),
        _ => path.to_path_buf(),
    };
    let absolute = std::path::absolute(&expanded).unwrap_or(expanded);
    if absolute.is_file() {
        Ok(absolute)
    } else {
        Err(SpecError::NotFound(format!(
            "{origin} = {}: ONNX Runtime library not found (no such file {}; expected the path of \
             libonnxruntime.so.1.x)",
            path.display(),
            absolute.display()
        )))
    }
}

/// The interpreters whose onnxruntime wheel is searched, in order: `$SPECRT_PYTHON` alone when set; otherwise
/// `$VIRTUAL_ENV/bin/python` (when set), the `.venv/bin/python` of `cwd` or of the nearest folder above it that has
/// one, then `python3` (on `PATH`). Each comes with where it came from, for the "searched" list.
#[must_use]
pub fn python_candidates(cwd: &Path) -> Vec<(PathBuf, String)> {
    if let Some(p) = std::env::var_os(PYTHON_ENV).filter(|v| !v.is_empty()) {
        return vec![(PathBuf::from(p), format!("${PYTHON_ENV}"))];
    }
    let mut out = Vec::new();
    if let Some(venv) = std::env::var_os(VIRTUAL_ENV_ENV).filter(|v| !v.is_empty()) {
        out.push((
            Path::new(&venv).join("bin/python"),
            format!("${VIRTUAL_ENV_ENV}/bin/python"),
        ));
    }
    if let Some(p) = cwd
        .ancestors()
        .map(|d| d.join(".venv/bin/python"))
        .find(|p| p.exists())
    {
        out.push((p, "the .venv of this folder or one above it".to_owned()));
    }
    out.push((PathBuf::from("python3"), "python3 on PATH".to_owned()));
    out
}

/// The newest `capi/libonnxruntime.so.1*` of the onnxruntime wheel of the first of [`python_candidates`] that has
/// one; on failure, the lines for the "searched" list saying why each candidate failed.
fn wheel_library() -> std::result::Result<PathBuf, Vec<String>> {
    let cwd = std::env::current_dir().unwrap_or_default();
    let mut why = Vec::new();
    for (python, origin) in python_candidates(&cwd) {
        match wheel_library_of(&python, &origin) {
            Ok(path) => return Ok(path),
            Err(line) => why.push(line),
        }
    }
    Err(why)
}

/// The newest `capi/libonnxruntime.so.1*` of the onnxruntime wheel of `python`; on failure, the line for the
/// "searched" list saying why.
fn wheel_library_of(python: &Path, origin: &str) -> std::result::Result<PathBuf, String> {
    let shown = python.display().to_string();
    let what = format!("the onnxruntime wheel of `{shown}` ({origin})");
    let out = Command::new(python)
        .args(["-c", FIND_SPEC_SCRIPT])
        .output()
        .map_err(|e| format!("{what}: cannot run {shown}: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().last().unwrap_or("").trim();
        return Err(format!("{what}: {shown} failed ({}): {last}", out.status));
    }
    let package = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if package.is_empty() {
        return Err(format!("{what}: onnxruntime is not installed there"));
    }
    let capi = Path::new(&package).join("capi");
    newest_matching(&capi, "libonnxruntime.so.1")
        .ok_or_else(|| format!("{what}: no libonnxruntime.so.1* in {}", capi.display()))
}

/// The file in `dir` whose name starts with `prefix` and has the highest version suffix
/// (`libonnxruntime.so.1.32.0` beats `libonnxruntime.so.1.9.1` and `libonnxruntime.so`); `None` if there is none.
fn newest_matching(dir: &Path, prefix: &str) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(std::result::Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .max_by_key(|p| version_key(p))
}

/// Sort key of a library file name: the numbers after `.so` (`libonnxruntime.so.1.32.0` -> `[1, 32, 0]`), as the
/// Python side sorts them.
fn version_key(path: &Path) -> Vec<u64> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let suffix = name.split_once(".so").map_or("", |(_, s)| s);
    suffix
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    /// [`find_ort_library`]'s search over `system_dirs`.
    fn find(explicit: Option<&Path>, system_dirs: &[PathBuf]) -> Result<PathBuf> {
        find_in(explicit, system_dirs, wheel_library, RUST_INSTALL)
    }

    use super::*;
    use std::ffi::OsString;
    use std::sync::Mutex;

    /// Tests that set environment variables run one at a time (the process environment is shared).
    static ENV_LOCK: Mutex<()> = Mutex::new(());

    /// Sets (or removes) variables for the life of the guard, restoring the old values on drop.
    struct EnvGuard {
        saved: Vec<(&'static str, Option<OsString>)>,
        _lock: std::sync::MutexGuard<'static, ()>,
    }

    impl EnvGuard {
        fn new(vars: &[(&'static str, Option<&std::ffi::OsStr>)]) -> Self {
            let lock = ENV_LOCK
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let saved = vars
                .iter()
                .map(|&(k, v)| {
                    let old = std::env::var_os(k);
                    // Safe while every test touching the environment holds ENV_LOCK.
                    match v {
                        Some(v) => std::env::set_var(k, v),
                        None => std::env::remove_var(k),
                    }
                    (k, old)
                })
                .collect();
            Self { saved, _lock: lock }
        }
    }

    impl Drop for EnvGuard {
        fn drop(&mut self) {
            for (k, old) in self.saved.drain(..) {
                match old {
                    Some(v) => std::env::set_var(k, v),
                    None => std::env::remove_var(k),
                }
            }
        }
    }

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"").unwrap();
    }

    /// A fake interpreter that prints `package` whatever it is asked (stands in for `python3 -c ...`).
    fn fake_python(dir: &Path, package: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("fake-python");
        std::fs::write(&path, format!("#!/bin/sh\necho '{package}'\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// No variables, an interpreter that finds no onnxruntime: only the system folders are left.
    fn no_env(python: &Path) -> EnvGuard {
        EnvGuard::new(&[
            (ORT_LIBRARY_ENV, None),
            (ORT_DYLIB_PATH_ENV, None),
            (PYTHON_ENV, Some(python.as_os_str())),
        ])
    }

    #[test]
    fn interpreters_are_specrt_python_alone_else_venv_then_checkout_venv_then_python3() {
        let tmp = tempfile::tempdir().unwrap();
        let checkout = tmp.path().join("repo");
        touch(&checkout.join(".venv/bin/python"));
        let deep = checkout.join("rust/specrt-ort");
        std::fs::create_dir_all(&deep).unwrap();
        let names = |c: Vec<(PathBuf, String)>| c.into_iter().map(|(p, _)| p).collect::<Vec<_>>();
        {
            let _env = EnvGuard::new(&[
                (PYTHON_ENV, None),
                (VIRTUAL_ENV_ENV, Some("/venvs/a".as_ref())),
            ]);
            assert_eq!(
                names(python_candidates(&deep)),
                vec![
                    PathBuf::from("/venvs/a/bin/python"),
                    checkout.join(".venv/bin/python"),
                    PathBuf::from("python3")
                ]
            );
            // No .venv above: the active venv, then python3.
            assert_eq!(
                names(python_candidates(tmp.path())),
                vec![
                    PathBuf::from("/venvs/a/bin/python"),
                    PathBuf::from("python3")
                ]
            );
        }
        let _env = EnvGuard::new(&[
            (PYTHON_ENV, Some("/opt/py".as_ref())),
            (VIRTUAL_ENV_ENV, None),
        ]);
        assert_eq!(
            names(python_candidates(&deep)),
            vec![PathBuf::from("/opt/py")]
        );
    }

    #[test]
    fn version_key_orders_numerically() {
        let key = |s: &str| version_key(Path::new(s));
        assert_eq!(key("/x/libonnxruntime.so.1.32.0"), vec![1, 32, 0]);
        assert!(key("libonnxruntime.so.1.32.0") > key("libonnxruntime.so.1.9.1"));
        assert!(key("libonnxruntime.so.1") > key("libonnxruntime.so"));
    }

    #[test]
    fn explicit_path_then_specrt_variable_then_ort_dylib_path() {
        let tmp = tempfile::tempdir().unwrap();
        let explicit = tmp.path().join("a/libonnxruntime.so.1.20.0");
        let ours = tmp.path().join("b/libonnxruntime.so.1.21.0");
        let theirs = tmp.path().join("c/libonnxruntime.so.1.22.0");
        for p in [&explicit, &ours, &theirs] {
            touch(p);
        }
        let _env = EnvGuard::new(&[
            (ORT_LIBRARY_ENV, Some(ours.as_os_str())),
            (ORT_DYLIB_PATH_ENV, Some(theirs.as_os_str())),
        ]);
        assert_eq!(find(Some(&explicit), &[]).unwrap(), explicit);
        assert_eq!(find(None, &[]).unwrap(), ours);
    }

    #[test]
    fn the_python_package_search_takes_the_given_wheel_after_the_variables() {
        let tmp = tempfile::tempdir().unwrap();
        let package = tmp.path().join("site-packages/onnxruntime");
        touch(&package.join("capi/libonnxruntime.so.1.9.1"));
        touch(&package.join("capi/libonnxruntime.so.1.32.0"));
        let ours = tmp.path().join("b/libonnxruntime.so.1.21.0");
        touch(&ours);
        {
            let _env = EnvGuard::new(&[(ORT_LIBRARY_ENV, None), (ORT_DYLIB_PATH_ENV, None)]);
            assert_eq!(
                find_ort_library_in_package(Some(&package), "pip install x").unwrap(),
                package.join("capi/libonnxruntime.so.1.32.0")
            );
            // No wheel (and, on this machine, no system install is assumed absent): the message says why and how.
            if let Err(SpecError::NotFound(m)) =
                find_ort_library_in_package(None, "pip install 'specrt[cpu]'")
            {
                assert!(
                    m.contains("onnxruntime is not installed")
                        && m.ends_with("pip install 'specrt[cpu]'"),
                    "{m}"
                );
            }
        }
        let _env = EnvGuard::new(&[
            (ORT_LIBRARY_ENV, Some(ours.as_os_str())),
            (ORT_DYLIB_PATH_ENV, None),
        ]);
        assert_eq!(
            find_ort_library_in_package(Some(&package), "").unwrap(),
            ours
        );
    }

    #[test]
    fn missing_explicit_path_is_an_error_naming_it() {
        let _env = EnvGuard::new(&[(ORT_LIBRARY_ENV, None)]);
        let err = find(Some(Path::new("/nonexistent/libonnxruntime.so.1.2")), &[]).unwrap_err();
        let SpecError::NotFound(msg) = err else {
            panic!("expected NotFound, got {err:?}")
        };
        assert!(
            msg.contains("--ort-library") && msg.contains("/nonexistent/libonnxruntime.so.1.2"),
            "{msg}"
        );
    }

    #[test]
    fn ort_dylib_path_is_used_when_ours_is_unset_or_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let theirs = tmp.path().join("libonnxruntime.so.1.22.0");
        touch(&theirs);
        let _env = EnvGuard::new(&[
            (ORT_LIBRARY_ENV, Some("".as_ref())),
            (ORT_DYLIB_PATH_ENV, Some(theirs.as_os_str())),
        ]);
        assert_eq!(find(None, &[]).unwrap(), theirs);
    }

    #[test]
    fn a_variable_naming_no_file_is_an_error_not_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let system = tmp.path().join("lib");
        touch(&system.join("libonnxruntime.so.1.20.0"));
        let missing = tmp.path().join("gone/libonnxruntime.so.1.20.0");
        let _env = EnvGuard::new(&[
            (ORT_LIBRARY_ENV, None),
            (ORT_DYLIB_PATH_ENV, Some(missing.as_os_str())),
        ]);
        let err = find(None, &[system]).unwrap_err();
        assert!(
            matches!(&err, SpecError::NotFound(m) if m.contains("$ORT_DYLIB_PATH") && m.contains("gone")),
            "{err}"
        );
    }

    #[test]
    fn wheel_copy_is_found_through_the_interpreter_newest_first() {
        let tmp = tempfile::tempdir().unwrap();
        let package = tmp.path().join("site-packages/onnxruntime");
        for v in ["1.9.1", "1.22.0", "1.20.1"] {
            touch(&package.join(format!("capi/libonnxruntime.so.{v}")));
        }
        touch(&package.join("capi/libonnxruntime_providers_shared.so"));
        let python = fake_python(tmp.path(), package.to_str().unwrap());
        let system = tmp.path().join("lib");
        touch(&system.join("libonnxruntime.so.1.30.0"));
        let _env = no_env(&python);
        assert_eq!(
            find(None, &[system]).unwrap(),
            package.join("capi/libonnxruntime.so.1.22.0")
        );
    }

    #[test]
    fn system_folders_come_last_in_their_order() {
        let tmp = tempfile::tempdir().unwrap();
        let python = fake_python(tmp.path(), ""); // onnxruntime not installed
        let (first, second) = (tmp.path().join("usr/lib"), tmp.path().join("opt/lib"));
        touch(&first.join("libonnxruntime.so"));
        touch(&first.join("libonnxruntime.so.1.17.0"));
        touch(&second.join("libonnxruntime.so.1.30.0"));
        let _env = no_env(&python);
        assert_eq!(
            find(None, &[tmp.path().join("empty"), first.clone(), second]).unwrap(),
            first.join("libonnxruntime.so.1.17.0")
        );
    }

    #[test]
    fn nothing_found_names_every_place_and_the_install_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let python = fake_python(tmp.path(), "");
        let system = tmp.path().join("lib");
        let _env = no_env(&python);
        let err = find(None, std::slice::from_ref(&system)).unwrap_err();
        let SpecError::NotFound(msg) = err else {
            panic!("expected NotFound, got {err:?}")
        };
        for needle in [
            "--ort-library",
            "$SPECRT_ORT_LIBRARY: unset",
            "$ORT_DYLIB_PATH: unset",
            "onnxruntime is not installed",
            python.to_str().unwrap(),
            system.to_str().unwrap(),
            "pip install onnxruntime",
            "pip install 'onnxruntime-gpu[cuda,cudnn]'",
        ] {
            assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
        }
    }

    #[test]
    fn an_interpreter_that_cannot_run_is_reported_and_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let python = tmp.path().join("no-such-python");
        let system = tmp.path().join("lib");
        touch(&system.join("libonnxruntime.so.1.20.0"));
        let _env = no_env(&python);
        assert_eq!(
            find(None, std::slice::from_ref(&system)).unwrap(),
            system.join("libonnxruntime.so.1.20.0")
        );
        let err = find(None, &[]).unwrap_err();
        assert!(err.to_string().contains("cannot run"), "{err}");
    }
}
