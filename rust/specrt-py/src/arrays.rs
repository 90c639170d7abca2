//! Zero-copy numpy reads with clear errors: C-contiguous float32 arrays are borrowed as slices; anything else
//! (wrong dtype, ndim, shape or layout) is a `ShapeError` naming what was expected.

use numpy::ndarray::Dimension;
use numpy::{
    PyArray, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray, PyReadonlyArray1,
    PyReadonlyArray2, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use specrt_core::SpecError;

use crate::errors::to_pyerr;

fn shape_err(msg: String) -> PyErr {
    to_pyerr(SpecError::Shape(msg))
}

/// Describe an object for an error message: dtype and shape of an array, or its Python type.
fn describe(obj: &Bound<'_, PyAny>) -> String {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        let dtype = a
            .dtype()
            .str()
            .map_or_else(|_| "?".to_owned(), |s| s.to_string());
        format!("a {dtype} array of shape {:?}", a.shape())
    } else {
        let t = obj
            .get_type()
            .name()
            .map_or_else(|_| "?".to_owned(), |n| n.to_string());
        format!("an object of type {t}")
    }
}

/// `obj` as a C-contiguous float32 array of `D`'s number of dimensions (the shape is the caller's to check).
fn f32_contiguous<'a, 'py, D: Dimension>(
    obj: &'a Bound<'py, PyAny>,
    name: &str,
    expected: &str,
) -> PyResult<&'a Bound<'py, PyArray<f32, D>>> {
    let Ok(arr) = obj.cast::<PyArray<f32, D>>() else {
        return Err(shape_err(format!(
            "{name} must be a C-contiguous float32 array of shape {expected}, got {}",
            describe(obj)
        )));
    };
    if !arr.is_c_contiguous() {
        return Err(shape_err(format!(
            "{name} must be a C-contiguous float32 array of shape {expected}, got a non-contiguous array of shape \
             {:?} (use numpy.ascontiguousarray)",
            arr.shape()
        )));
    }
    Ok(arr)
}

/// Borrow `obj` as a `[rows, cols] float32` C-contiguous array. `expected` describes the shape for messages
/// (e.g. `"[k + 1, vocab]"`); `rows` / `cols` are checked when given.
///
/// # Errors
/// `ShapeError` naming the expected dtype, shape and layout.
pub fn f32_2d<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    expected: &str,
    rows: Option<usize>,
    cols: Option<usize>,
) -> PyResult<PyReadonlyArray2<'py, f32>> {
    let arr = f32_contiguous::<numpy::Ix2>(obj, name, expected)?;
    let shape = arr.shape();
    if rows.is_some_and(|r| r != shape[0]) || cols.is_some_and(|c| c != shape[1]) {
        return Err(shape_err(format!(
            "{name} has shape {shape:?}, expected {expected} = [{}, {}]",
            rows.map_or_else(|| "*".to_owned(), |r| r.to_string()),
            cols.map_or_else(|| "*".to_owned(), |c| c.to_string()),
        )));
    }
    Ok(arr.readonly())
}

/// Borrow `obj` as a `[n] float32` C-contiguous array (`n` checked when given).
///
/// # Errors
/// `ShapeError` naming the expected dtype, shape and layout.
pub fn f32_1d<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    expected: &str,
    n: Option<usize>,
) -> PyResult<PyReadonlyArray1<'py, f32>> {
    let arr = f32_contiguous::<numpy::Ix1>(obj, name, expected)?;
    if let Some(n) = n {
        if arr.shape()[0] != n {
            return Err(shape_err(format!(
                "{name} has shape {:?}, expected {expected} = [{n}]",
                arr.shape()
            )));
        }
    }
    Ok(arr.readonly())
}

/// The elements of a borrowed `f32` array as one row-major slice.
///
/// # Errors
/// `ShapeError` if the array is not contiguous (`f32_1d` / `f32_2d` have checked that already).
pub fn as_slice<'a, D: Dimension>(arr: &'a PyReadonlyArray<'_, f32, D>) -> PyResult<&'a [f32]> {
    arr.as_slice().map_err(|e| shape_err(e.to_string()))
}

/// Token ids from a 1-D numpy integer array (any width) or a sequence of Python ints, checked against `vocab`.
///
/// # Errors
/// `ShapeError` for a non-integer / non-1-D input, `VocabError` for an id outside `0..vocab`.
pub fn token_ids(obj: &Bound<'_, PyAny>, name: &str, vocab: usize) -> PyResult<Vec<u32>> {
    let values: Vec<i64> = if let Ok(a) = obj.cast::<PyUntypedArray>() {
        let kind = a.dtype().kind();
        if a.ndim() != 1 || !(kind == b'i' || kind == b'u') {
            return Err(shape_err(format!(
                "{name} must be a 1-D integer array or a sequence of ints, got {}",
                describe(obj)
            )));
        }
        a.call_method1("astype", ("int64",))?
            .extract::<Vec<i64>>()
            .map_err(|_| shape_err(format!("{name}: could not read the ids as int64")))?
    } else {
        obj.extract::<Vec<i64>>().map_err(|_| {
            shape_err(format!(
                "{name} must be a 1-D integer array or a sequence of ints, got {}",
                describe(obj)
            ))
        })?
    };
    values
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            u32::try_from(t)
                .ok()
                .filter(|&v| (v as usize) < vocab)
                .ok_or_else(|| {
                    to_pyerr(SpecError::Vocab(format!(
                        "{name}[{i}] = {t} is out of range (expected 0 <= id < vocab size {vocab})"
                    )))
                })
        })
        .collect()
}
