//! specrt's own ONNX Runtime CPU operators, domain [`DOMAIN`], registered on every session specrt makes
//! ([`operators`]): the GGUF-block matmul and embedding lookup of `specrt_quant`.
//!
//! - `GgufMatMul(A float32 [..., K], B uint8 [N, row_bytes]) -> Y float32 [..., N]`, `Y = A · dequantize(B)^T`;
//!   attributes `ggml_type` (ggml's type id), `K`, `N`. Runs on ONNX Runtime's intra-op thread pool.
//! - `GgufGather(B uint8 [V, row_bytes], indices int64 [...]) -> Y float32 [..., K]`, `Y = dequantize(B)[indices]`;
//!   attributes `ggml_type`, `K`.
//!
//! `B` is the GGUF tensor's bytes as stored (the converter's dtype `gguf`), so the weights a session computes with
//! are the GGUF's, bit for bit. On the SIMD paths `B` is repacked into `specrt_quant::Packed` column groups (the
//! same codes and scales, rearranged; as many bytes again as the initializer, 2.8% more for Q4_K / Q5_K), which the
//! kernels compute from: when the session is created if `B` is an initializer (on the session's intra-op thread
//! count, so loading takes the time and the first request does not), else at the node's first run; the copy is
//! kept with the kernel while `B`'s buffer stays the same.

use std::sync::{Arc, Mutex};

use ort::operator::{
    BoxedKernel, ComputeContext, KernelContext, Operator, OperatorDomain, OperatorInput,
    OperatorOutput,
};
use ort::value::TensorElementType;
use specrt_core::{Result, SpecError};
use specrt_quant::{GgmlType, KernelPath, Packed, ParallelFor, QMatrix};

/// The operator domain of specrt's own operators (graphs import it as opset `("ai.specrt", 1)`).
pub const DOMAIN: &str = "ai.specrt";

/// A fresh domain holding every specrt operator, for one session builder; `pack_threads`: the threads that repack
/// a node's weights when the session is created (the session's intra-op thread count).
///
/// # Errors
/// `SpecError::Backend` when ONNX Runtime refuses the domain.
pub fn operators(pack_threads: usize) -> Result<OperatorDomain> {
    let err = |e: ort::Error| SpecError::Backend {
        code: format!("{:?}", e.code()),
        message: format!("registering the {DOMAIN} operators: {}", e.message()),
    };
    OperatorDomain::new(DOMAIN)
        .and_then(|d| d.add(GgufMatMul { pack_threads }))
        .and_then(|d| d.add(GgufGather))
        .map_err(err)
}

/// The checked attributes of a node.
fn attributes(kctx: &KernelContext<'_>, with_n: bool) -> ort::Result<(GgmlType, usize, usize)> {
    let node = kctx.node_name().unwrap_or_default();
    let get = |name: &str| -> ort::Result<i64> {
        kctx.get::<i64>(name).ok_or_else(|| {
            ort::Error::new(format!(
                "{DOMAIN} node {node:?}: attribute {name} is missing"
            ))
        })
    };
    let ty = GgmlType::from_id(get("ggml_type")?)
        .map_err(|e| ort::Error::new(format!("node {node:?}: {e}")))?;
    let dim = |name: &str| -> ort::Result<usize> {
        let v = get(name)?;
        usize::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| {
            ort::Error::new(format!(
                "{DOMAIN} node {node:?}: attribute {name} = {v} is invalid (expected > 0)"
            ))
        })
    };
    let k = dim("K")?;
    ty.row_bytes(k)
        .map_err(|e| ort::Error::new(format!("node {node:?}: {e}")))?;
    let n = if with_n { dim("N")? } else { 0 };
    Ok((ty, k, n))
}

fn to_ort(e: &SpecError) -> ort::Error {
    ort::Error::new(e.to_string())
}

/// ONNX Runtime's intra-op thread pool as the kernel's [`ParallelFor`]; the first error is kept for the caller.
struct OrtPool<'a> {
    ctx: &'a ComputeContext,
    error: Mutex<Option<ort::Error>>,
}

impl ParallelFor for OrtPool<'_> {
    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if let Err(e) = self.ctx.par_for(tasks, tasks, f) {
            *self
                .error
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e);
        }
    }
}

/// `ai.specrt::GgufMatMul`; `pack_threads` repack an initializer `B` when the session creates the kernel.
struct GgufMatMul {
    pack_threads: usize,
}

/// The packed copy of one `B`, with the address and length of the bytes it was packed from.
type PackedCache = Mutex<Option<(usize, usize, Arc<Packed>)>>;

/// `B` packed now when it is an initializer of the graph (`None` otherwise: packed at the first run).
fn pack_initializer(
    kctx: &KernelContext<'_>,
    ty: GgmlType,
    k: usize,
    n: usize,
    threads: usize,
) -> Option<(usize, usize, Arc<Packed>)> {
    let b = kctx
        .constant_input::<ort::value::DynTensorValueType>(1)
        .ok()?;
    let (_, blocks) = b.try_extract_tensor::<u8>().ok()?;
    // A malformed B is left for the first run, which reports it.
    let w = QMatrix::new(ty, n, k, blocks).ok()?;
    let packed = Arc::new(Packed::new_threads(&w, threads));
    Some((blocks.as_ptr() as usize, blocks.len(), packed))
}

impl Operator for GgufMatMul {
    type Kernel<'attr> = BoxedKernel<'attr>;

    fn name(&self) -> &str {
        "GgufMatMul"
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        [
            OperatorInput::required(TensorElementType::Float32),
            OperatorInput::required(TensorElementType::Uint8),
        ]
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float32)]
    }

    fn create_kernel<'attr>(
        &self,
        kctx: &KernelContext<'attr>,
    ) -> ort::Result<Self::Kernel<'attr>> {
        let (ty, k, n) = attributes(kctx, true)?;
        let path = KernelPath::best();
        let cache: PackedCache = Mutex::new(if specrt_quant::wants_packed(path) {
            pack_initializer(kctx, ty, k, n, self.pack_threads)
        } else {
            None
        });
        Ok(Box::new(move |ctx: &ComputeContext| {
            let a = ctx
                .input(0)?
                .ok_or_else(|| ort::Error::new("GgufMatMul: input A is missing"))?;
            let b = ctx
                .input(1)?
                .ok_or_else(|| ort::Error::new("GgufMatMul: input B is missing"))?;
            let (a_shape, x) = a.try_extract_tensor::<f32>()?;
            let (_, blocks) = b.try_extract_tensor::<u8>()?;
            let dims: Vec<i64> = a_shape.iter().copied().collect();
            if dims.last().copied() != Some(k as i64) {
                return Err(ort::Error::new(format!(
                    "GgufMatMul: A's shape {dims:?} does not end in K = {k}"
                )));
            }
            let m = x.len() / k;
            let w = QMatrix::new(ty, n, k, blocks).map_err(|e| to_ort(&e))?;
            let mut out_dims = dims.clone();
            *out_dims.last_mut().expect("checked non-empty") = n as i64;
            let mut y = ctx
                .output(0, out_dims)?
                .ok_or_else(|| ort::Error::new("GgufMatMul: output Y is missing"))?;
            let (_, out) = y.try_extract_tensor_mut::<f32>()?;
            let pool = OrtPool {
                ctx,
                error: Mutex::new(None),
            };
            let mut scratch = specrt_quant::Scratch::default();
            if specrt_quant::wants_packed(path) {
                let key = (blocks.as_ptr() as usize, blocks.len());
                let packed = {
                    let mut slot = cache
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    match &*slot {
                        Some((a, l, p)) if (*a, *l) == key => Arc::clone(p),
                        _ => {
                            let p = Arc::new(Packed::new(&w));
                            *slot = Some((key.0, key.1, Arc::clone(&p)));
                            p
                        }
                    }
                };
                packed.matmul(x, m, out, path, &mut scratch, &pool)
            } else {
                specrt_quant::matmul(&w, x, m, out, path, &mut scratch, &pool)
            }
            .map_err(|e| to_ort(&e))?;
            match pool
                .error
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
            {
                Some(e) => Err(e),
                None => Ok(()),
            }
        }))
    }
}

/// `ai.specrt::GgufGather`.
struct GgufGather;

impl Operator for GgufGather {
    type Kernel<'attr> = BoxedKernel<'attr>;

    fn name(&self) -> &str {
        "GgufGather"
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        [
            OperatorInput::required(TensorElementType::Uint8),
            OperatorInput::required(TensorElementType::Int64),
        ]
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float32)]
    }

    fn create_kernel<'attr>(
        &self,
        kctx: &KernelContext<'attr>,
    ) -> ort::Result<Self::Kernel<'attr>> {
        let (ty, k, _) = attributes(kctx, false)?;
        Ok(Box::new(move |ctx: &ComputeContext| {
            let b = ctx
                .input(0)?
                .ok_or_else(|| ort::Error::new("GgufGather: input B is missing"))?;
            let i = ctx
                .input(1)?
                .ok_or_else(|| ort::Error::new("GgufGather: input indices is missing"))?;
            let (b_shape, blocks) = b.try_extract_tensor::<u8>()?;
            let (i_shape, indices) = i.try_extract_tensor::<i64>()?;
            let rows = usize::try_from(b_shape.first().copied().unwrap_or(0)).unwrap_or(0);
            let w = QMatrix::new(ty, rows, k, blocks).map_err(|e| to_ort(&e))?;
            let mut out_dims: Vec<i64> = i_shape.iter().copied().collect();
            out_dims.push(k as i64);
            let mut y = ctx
                .output(0, out_dims)?
                .ok_or_else(|| ort::Error::new("GgufGather: output Y is missing"))?;
            let (_, out) = y.try_extract_tensor_mut::<f32>()?;
            specrt_quant::gather(&w, indices, out).map_err(|e| to_ort(&e))
        }))
    }
}
