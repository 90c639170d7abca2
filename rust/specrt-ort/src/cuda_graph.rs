//! CUDA graph capture and replay of the decode steps: the graph form (`specrt convert --attention gqa-graph`) on the
//! CUDA provider with [`crate::OrtOptions::cuda_graph`], and the same steps on the CPU provider with
//! [`crate::OrtOptions::cpu_graph_steps`] (nothing captured: the invariants below checked without a GPU).
//!
//! ONNX Runtime's CUDA provider (session option `enable_cuda_graph`) captures a run into a CUDA graph and then
//! replays it, skipping hundreds of kernel launches per step. A replay runs the captured kernels on the captured
//! addresses, so it relies on two invariants, which [`ReplayLedger`] checks before every step run, on every provider:
//!
//! 1. **Same addresses, same shapes**: every tensor a graph binds (inputs, outputs, the KV buffers) is at the address
//!    and of the shape it had when that graph was captured.
//! 2. **Nothing persistent in memory a graph may write**: the intermediates of a captured run come from the session's
//!    arena and are returned to it after the capture, while the graph keeps writing them on every replay. A device
//!    tensor allocated from that arena after a capture may overlap them, so every bound tensor that is not rewritten
//!    before each run (`logits_index`, the KV cache) must have been allocated before the first capture.
//!
//! Hence every [`GraphStep`] is created when the backend loads, before any run (the earlier code created them on
//! first use: a 4-token verification first needed at token 60 got a `logits_index` in memory that the 1- and 5-token
//! graphs' replays overwrote, and gave wrong tokens from then on).
//!
//! The graph form makes every per-call value a tensor: one [`GraphStep`] per step shape (`s` new tokens, `rows`
//! logits rows: `rows = s` for a 1-token draft step or a K + 1-token verification, at most [`MAX_GRAPH_TOKENS`];
//! `rows = 1` for the draft's 2-token catch-up after a fully accepted round) owns tensors for `input_ids`,
//! `seqlens_k` and `logits_index`, writes the first two before each run ([`Copier`]: plain `cudaMemcpy` through the
//! CUDA runtime the provider loaded, or ONNX Runtime's copy as a fallback), binds `total_sequence_length` (a host
//! input of GroupQueryAttention) to the cache capacity, and binds `logits` / `argmax` to tensors copied back after
//! the run (only the one the caller reads). Prefill chunks and other shapes run without a graph
//! (`gpu_graph_id = -1`).

use std::collections::HashMap;
use std::ffi::c_void;

use ort::{
    memory::Allocator,
    session::{IoBinding, RunOptions, Session},
    value::{DynTensor, Tensor},
    AsPointer,
};
use specrt_core::{Result, SpecError};

use crate::kv_binding::bind_kv_buffers;
use crate::runtime::ort_err;

/// Longest step (new tokens) run from a CUDA graph; longer calls (prefill chunks) run without one.
pub const MAX_GRAPH_TOKENS: usize = 16;

/// Environment variable that makes the graph steps copy their inputs and outputs with ONNX Runtime's copy (an
/// identity-model run per copy) instead of `cudaMemcpy`: `SPECRT_GRAPH_COPIES=onnxruntime`. For the GPU bench's
/// comparison of the two.
pub const GRAPH_COPIES_ENV: &str = "SPECRT_GRAPH_COPIES";

/// Run options of calls made without a graph in a graph-enabled session.
pub(crate) fn no_graph_options() -> Result<RunOptions> {
    let mut options = RunOptions::new().map_err(|e| ort_err("creating run options", &e))?;
    options
        .set("gpu_graph_id", "-1")
        .map_err(|e| ort_err("setting gpu_graph_id", &e))?;
    Ok(options)
}

/// The step shapes `(new tokens, logits rows)` that run from a graph: `(s, s)` for `s` in
/// `1..=`[`MAX_GRAPH_TOKENS`] (draft steps, verifications for every K auto K may choose) and `(2, 1)` (the draft's
/// catch-up after a fully accepted round: the last draft token and the bonus token, the next proposal's logits).
pub(crate) fn graph_shapes() -> impl Iterator<Item = (usize, usize)> {
    (1..=MAX_GRAPH_TOKENS).map(|s| (s, s)).chain([(2, 1)])
}

/// Whether a call of `s` new tokens returning `n_logits` rows runs from a graph.
pub(crate) fn is_graph_shape(s: usize, n_logits: usize) -> bool {
    graph_shapes().any(|shape| shape == (s, n_logits))
}

/// The graph id (ONNX Runtime's `gpu_graph_id`, and the index of the step) of a step shape.
pub(crate) fn graph_id(s: usize, rows: usize) -> usize {
    if rows == s {
        s
    } else {
        MAX_GRAPH_TOKENS + s
    }
}

/// One tensor bound to a graph step, as [`ReplayLedger`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BoundRecord {
    /// Input or output name.
    pub name: String,
    /// Data address.
    pub address: usize,
    /// Shape.
    pub shape: Vec<usize>,
    /// When it was allocated ([`ReplayLedger::allocation`]).
    pub allocated: u64,
    /// Written before every run (an input the step writes, or an output the run writes and the step reads at once).
    pub rewritten_each_run: bool,
}

/// The record of what each graph bound when it was captured, and of allocations and captures in order: checks the
/// two invariants of the module docs before every step run.
#[derive(Debug, Default)]
pub(crate) struct ReplayLedger {
    next_allocation: u64,
    first_capture: Option<u64>,
    captured: HashMap<usize, Vec<BoundRecord>>,
}

impl ReplayLedger {
    /// A new ledger; allocation 0 stands for what the backend allocated before it (the KV cache).
    pub(crate) fn new() -> Self {
        Self {
            next_allocation: 1,
            ..Self::default()
        }
    }

    /// The sequence number of a new allocation.
    pub(crate) fn allocation(&mut self) -> u64 {
        let n = self.next_allocation;
        self.next_allocation += 1;
        n
    }

    /// Whether graph `id` ran (was captured) before.
    #[cfg(test)]
    pub(crate) fn is_captured(&self, id: usize) -> bool {
        self.captured.contains_key(&id)
    }

    /// Check graph `id`'s bound tensors before its run; the first run of an id counts as its capture (ONNX Runtime
    /// may capture on a later run: checking from the first is stricter).
    ///
    /// Errors: [`SpecError::Internal`] naming the tensor, the graph and the broken invariant.
    pub(crate) fn check_run(&mut self, id: usize, bound: &[BoundRecord]) -> Result<()> {
        if let Some(first) = self.first_capture {
            if let Some(b) = bound
                .iter()
                .find(|b| !b.rewritten_each_run && b.allocated >= first)
            {
                return Err(SpecError::Internal(format!(
                    "CUDA graph {id}: {} was allocated after a graph was captured and is not rewritten before each \
                     run; a captured graph's replays may overwrite it (allocate every graph step before the first \
                     capture)",
                    b.name
                )));
            }
        }
        match self.captured.get(&id) {
            None => {
                self.captured.insert(id, bound.to_vec());
                self.first_capture.get_or_insert(self.next_allocation);
            }
            Some(at_capture) => {
                for b in bound {
                    let Some(c) = at_capture.iter().find(|c| c.name == b.name) else {
                        return Err(SpecError::Internal(format!(
                            "CUDA graph {id}: {} is bound now but was not when the graph was captured",
                            b.name
                        )));
                    };
                    if (c.address, &c.shape) != (b.address, &b.shape) {
                        return Err(SpecError::Internal(format!(
                            "CUDA graph {id}: {} is bound at {:#x} with shape {:?}, but was at {:#x} with shape {:?} \
                             when the graph was captured (a replay reads and writes the captured address)",
                            b.name, b.address, b.shape, c.address, c.shape
                        )));
                    }
                }
                if at_capture.len() != bound.len() {
                    return Err(SpecError::Internal(format!(
                        "CUDA graph {id}: {} tensors bound, {} when the graph was captured",
                        bound.len(),
                        at_capture.len()
                    )));
                }
            }
        }
        Ok(())
    }
}

/// `cudaMemcpy` and `cudaStreamSynchronize` of the CUDA runtime the CUDA provider loaded.
pub(crate) struct CudaRuntime {
    memcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, i32) -> i32,
    stream_synchronize: unsafe extern "C" fn(*mut c_void) -> i32,
    _library: libloading::os::unix::Library,
}

/// `cudaMemcpyHostToDevice`.
const CUDA_MEMCPY_H2D: i32 = 1;
/// `cudaMemcpyDeviceToHost`.
const CUDA_MEMCPY_D2H: i32 = 2;

impl CudaRuntime {
    /// The CUDA runtime already in the process (the CUDA provider's dependency), never a new load.
    fn loaded() -> Option<Self> {
        for name in ["libcudart.so.13", "libcudart.so.12", "libcudart.so"] {
            // SAFETY: RTLD_NOLOAD only returns a library that is already loaded (its initialisers have run).
            let library = unsafe {
                libloading::os::unix::Library::open(
                    Some(name),
                    libloading::os::unix::RTLD_NOW | libc_rtld_noload(),
                )
            };
            let Ok(library) = library else { continue };
            // SAFETY: the CUDA runtime's documented C signatures.
            let found = unsafe {
                (
                    library
                        .get::<unsafe extern "C" fn(*mut c_void, *const c_void, usize, i32) -> i32>(
                            b"cudaMemcpy\0",
                        )
                        .map(|f| *f),
                    library
                        .get::<unsafe extern "C" fn(*mut c_void) -> i32>(b"cudaStreamSynchronize\0")
                        .map(|f| *f),
                )
            };
            if let (Ok(memcpy), Ok(stream_synchronize)) = found {
                return Some(Self {
                    memcpy,
                    stream_synchronize,
                    _library: library,
                });
            }
        }
        None
    }

    fn check(code: i32, what: &str) -> Result<()> {
        if code == 0 {
            Ok(())
        } else {
            Err(SpecError::Backend {
                code: format!("cudaError {code}"),
                message: format!("{what} failed (CUDA runtime error {code})"),
            })
        }
    }
}

/// glibc's `RTLD_NOLOAD` (libloading exports the other flags only).
const fn libc_rtld_noload() -> std::os::raw::c_int {
    4
}

/// How a graph step moves its inputs to the device and its outputs back.
pub(crate) enum Copier {
    /// The CPU mode: the "device" tensors are host memory; plain copies.
    Host,
    /// `cudaMemcpy` through the CUDA runtime in the process; the host-to-device copies are followed by one
    /// `cudaStreamSynchronize` of the legacy stream (pageable copies may return before their DMA ends).
    Cuda(CudaRuntime),
    /// ONNX Runtime's copy (`copy_into`: a run of an identity model with a device sync): the fallback when no CUDA
    /// runtime is found, or when [`GRAPH_COPIES_ENV`] asks for it.
    Ort,
}

impl Copier {
    /// The copier of a backend: [`Copier::Host`] on the CPU, else `cudaMemcpy` unless the runtime is not found or
    /// `SPECRT_GRAPH_COPIES=onnxruntime`.
    pub(crate) fn for_device(on_cpu: bool) -> Self {
        if on_cpu {
            return Copier::Host;
        }
        if std::env::var(GRAPH_COPIES_ENV).is_ok_and(|v| v == "onnxruntime") {
            return Copier::Ort;
        }
        CudaRuntime::loaded().map_or(Copier::Ort, Copier::Cuda)
    }

    /// Name for reports: `"host"`, `"cudaMemcpy"` or `"onnxruntime"`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Copier::Host => "host",
            Copier::Cuda(_) => "cudaMemcpy",
            Copier::Ort => "onnxruntime",
        }
    }

    fn copy<T>(&self, src: &Tensor<T>, dst: &mut Tensor<T>, kind: i32, what: &str) -> Result<()>
    where
        T: ort::value::PrimitiveTensorElementType + std::fmt::Debug,
    {
        let bytes = std::mem::size_of::<T>() * src.shape().iter().product::<i64>().max(0) as usize;
        match self {
            Copier::Host => {
                // SAFETY: both tensors hold `bytes` bytes of host memory and do not overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src.data_ptr().cast::<u8>(),
                        dst.data_ptr_mut().cast::<u8>(),
                        bytes,
                    );
                }
                Ok(())
            }
            Copier::Cuda(rt) => {
                // SAFETY: a host and a device buffer of `bytes` bytes each (device: ONNX Runtime's CUDA allocator).
                let code = unsafe { (rt.memcpy)(dst.data_ptr_mut(), src.data_ptr(), bytes, kind) };
                CudaRuntime::check(code, what)
            }
            Copier::Ort => src.copy_into(dst).map_err(|e| ort_err(what, &e)),
        }
    }

    fn to_device<T>(&self, src: &Tensor<T>, dst: &mut Tensor<T>, what: &str) -> Result<()>
    where
        T: ort::value::PrimitiveTensorElementType + std::fmt::Debug,
    {
        self.copy(src, dst, CUDA_MEMCPY_H2D, what)
    }

    fn to_host<T>(&self, src: &Tensor<T>, dst: &mut Tensor<T>, what: &str) -> Result<()>
    where
        T: ort::value::PrimitiveTensorElementType + std::fmt::Debug,
    {
        self.copy(src, dst, CUDA_MEMCPY_D2H, what)
    }

    /// Wait until the host-to-device copies are on the device.
    fn inputs_done(&self) -> Result<()> {
        match self {
            Copier::Cuda(rt) => {
                // SAFETY: the null stream is the legacy default stream the copies ran on.
                let code = unsafe { (rt.stream_synchronize)(std::ptr::null_mut()) };
                CudaRuntime::check(code, "synchronizing the input copies")
            }
            Copier::Host | Copier::Ort => Ok(()),
        }
    }
}

/// The fixed-address tensors and binding of one step shape (one graph).
pub(crate) struct GraphStep {
    binding: IoBinding,
    /// `gpu_graph_id` set (CUDA); `None` on the CPU.
    run_options: Option<RunOptions>,
    id: usize,
    s: usize,
    rows: usize,
    ids_host: Tensor<i64>,
    ids_dev: Tensor<i64>,
    seqlens_host: Tensor<i32>,
    seqlens_dev: Tensor<i32>,
    index_dev: Tensor<i64>,
    total: Tensor<i32>,
    logits_dev: Tensor<f32>,
    logits_host: Tensor<f32>,
    argmax_dev: Tensor<i64>,
    argmax_host: Tensor<i64>,
    /// Allocation numbers ([`ReplayLedger::allocation`]) of this step's tensors.
    allocated: u64,
}

impl GraphStep {
    /// Allocate and bind the step of `s` new tokens returning the last `rows` logits rows: `kv` are the shared KV
    /// buffers in `[l0.key, l0.value, l1.key, ...]` order (bound as past and present, as the main binding does),
    /// `device` the allocator of the device tensors (CUDA's, or the session's CPU allocator in the CPU mode),
    /// `max_seq_len` the cache capacity (`total_sequence_length`), `cuda` whether graph ids are set.
    ///
    /// Errors: [`SpecError::Backend`] for allocation or binding failures.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        session: &Session,
        device: &Allocator,
        kv: &mut [DynTensor],
        (s, rows): (usize, usize),
        vocab: usize,
        max_seq_len: usize,
        cuda: bool,
        ledger: &mut ReplayLedger,
        copier: &Copier,
    ) -> Result<Self> {
        let host = session.allocator();
        let alloc_err = |what: &str| {
            let what = what.to_owned();
            move |e: ort::Error| ort_err(&format!("allocating {what} for the {s}-token graph"), &e)
        };
        let bind_err = |what: &'static str| move |e: ort::Error| ort_err(what, &e);
        let mut binding = session
            .create_binding()
            .map_err(|e| ort_err("creating a graph step's IO binding", &e))?;
        bind_kv_buffers(&mut binding, kv)?;
        let ids_dev = Tensor::<i64>::new(device, [1, s]).map_err(alloc_err("input_ids"))?;
        let seqlens_dev = Tensor::<i32>::new(device, [1_usize]).map_err(alloc_err("seqlens_k"))?;
        let mut index_dev =
            Tensor::<i64>::new(device, [rows]).map_err(alloc_err("logits_index"))?;
        let mut index_host = Tensor::<i64>::new(host, [rows]).map_err(alloc_err("logits_index"))?;
        for (i, v) in index_host.extract_tensor_mut().1.iter_mut().enumerate() {
            *v = i64::try_from(s - rows + i).expect("s <= MAX_GRAPH_TOKENS");
        }
        copier.to_device(
            &index_host,
            &mut index_dev,
            "copying logits_index to the device",
        )?;
        copier.inputs_done()?;
        let mut total = Tensor::<i32>::new(host, Vec::<i64>::new())
            .map_err(alloc_err("total_sequence_length"))?;
        total.extract_tensor_mut().1[0] = i32::try_from(max_seq_len).map_err(|_| {
            SpecError::Config(format!(
                "max_seq_len {max_seq_len} does not fit the graph form's int32 lengths"
            ))
        })?;
        binding
            .bind_input("input_ids", &ids_dev)
            .map_err(bind_err("binding input_ids"))?;
        binding
            .bind_input("seqlens_k", &seqlens_dev)
            .map_err(bind_err("binding seqlens_k"))?;
        binding
            .bind_input("logits_index", &index_dev)
            .map_err(bind_err("binding logits_index"))?;
        binding
            .bind_input("total_sequence_length", &total)
            .map_err(bind_err("binding total_sequence_length"))?;
        let mut logits_dev =
            Tensor::<f32>::new(device, [1, rows, vocab]).map_err(alloc_err("logits"))?;
        let mut argmax_dev = Tensor::<i64>::new(device, [1, rows]).map_err(alloc_err("argmax"))?;
        let upgrade = |what: &str| SpecError::Internal(format!("{what} view is not upgradable"));
        binding
            .bind_output(
                "logits",
                logits_dev
                    .view_mut()
                    .try_upgrade()
                    .map_err(|_| upgrade("logits"))?,
            )
            .map_err(bind_err("binding logits"))?;
        binding
            .bind_output(
                "argmax",
                argmax_dev
                    .view_mut()
                    .try_upgrade()
                    .map_err(|_| upgrade("argmax"))?,
            )
            .map_err(bind_err("binding argmax"))?;
        let id = graph_id(s, rows);
        let run_options = if cuda {
            let mut options = RunOptions::new().map_err(|e| ort_err("creating run options", &e))?;
            options
                .set("gpu_graph_id", id.to_string())
                .map_err(|e| ort_err("setting gpu_graph_id", &e))?;
            Some(options)
        } else {
            None
        };
        Ok(Self {
            binding,
            run_options,
            id,
            s,
            rows,
            ids_host: Tensor::<i64>::new(host, [1, s]).map_err(alloc_err("input_ids"))?,
            ids_dev,
            seqlens_host: Tensor::<i32>::new(host, [1_usize]).map_err(alloc_err("seqlens_k"))?,
            seqlens_dev,
            index_dev,
            total,
            logits_dev,
            logits_host: Tensor::<f32>::new(host, [1, rows, vocab]).map_err(alloc_err("logits"))?,
            argmax_dev,
            argmax_host: Tensor::<i64>::new(host, [1, rows]).map_err(alloc_err("argmax"))?,
            allocated: ledger.allocation(),
        })
    }

    /// The graph id of this step.
    pub(crate) fn id(&self) -> usize {
        self.id
    }

    /// Logits rows this step returns.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// What this step binds, for [`ReplayLedger::check_run`]; `kv` are the KV buffers' addresses and shape.
    fn records(&self, kv: &[usize], kv_shape: &[usize]) -> Vec<BoundRecord> {
        fn dims(shape: &[i64]) -> Vec<usize> {
            shape
                .iter()
                .map(|&d| usize::try_from(d).unwrap_or(0))
                .collect()
        }
        let rec =
            |name: &str, address: *const c_void, shape: Vec<usize>, rewritten: bool| BoundRecord {
                name: name.to_owned(),
                address: address as usize,
                shape,
                allocated: self.allocated,
                rewritten_each_run: rewritten,
            };
        let mut out = vec![
            rec(
                "input_ids",
                self.ids_dev.data_ptr(),
                dims(self.ids_dev.shape()),
                true,
            ),
            rec(
                "seqlens_k",
                self.seqlens_dev.data_ptr(),
                dims(self.seqlens_dev.shape()),
                true,
            ),
            rec(
                "logits_index",
                self.index_dev.data_ptr(),
                dims(self.index_dev.shape()),
                false,
            ),
            rec(
                "total_sequence_length",
                self.total.data_ptr(),
                dims(self.total.shape()),
                false,
            ),
            rec(
                "logits",
                self.logits_dev.data_ptr(),
                dims(self.logits_dev.shape()),
                true,
            ),
            rec(
                "argmax",
                self.argmax_dev.data_ptr(),
                dims(self.argmax_dev.shape()),
                true,
            ),
        ];
        out.extend(kv.iter().enumerate().map(|(i, &address)| BoundRecord {
            name: format!("kv buffer {i}"),
            address,
            shape: kv_shape.to_vec(),
            allocated: 0,
            rewritten_each_run: false,
        }));
        out
    }

    /// Run the step on `tokens` (`s` of them) after `n_past` cached positions: write the ids and `seqlens_k` to the
    /// device, check the replay invariants (`ledger`), run with this shape's graph id (ONNX Runtime captures on an
    /// early run and replays afterwards), and copy back the argmax ids (`ids`) or the logits. Read them with
    /// [`GraphStep::argmax`] / [`GraphStep::logits`].
    ///
    /// Errors: [`SpecError::Backend`] for copy or run failures; [`SpecError::Internal`] for a broken invariant.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &mut self,
        session: &Session,
        tokens: &[u32],
        n_past: usize,
        ids: bool,
        ledger: &mut ReplayLedger,
        copier: &Copier,
        (kv, kv_shape): (&[usize], &[usize]),
    ) -> Result<()> {
        debug_assert_eq!(tokens.len(), self.s);
        for (dst, &t) in self.ids_host.extract_tensor_mut().1.iter_mut().zip(tokens) {
            *dst = i64::from(t);
        }
        self.seqlens_host.extract_tensor_mut().1[0] =
            i32::try_from(n_past + self.s - 1).expect("max_seq_len fits in i32 (checked at load)");
        copier.to_device(
            &self.ids_host,
            &mut self.ids_dev,
            "copying input_ids to the device",
        )?;
        copier.to_device(
            &self.seqlens_host,
            &mut self.seqlens_dev,
            "copying seqlens_k to the device",
        )?;
        copier.inputs_done()?;
        ledger.check_run(self.id, &self.records(kv, kv_shape))?;
        let run_options = self
            .run_options
            .as_ref()
            .map_or(std::ptr::null(), |o| o.ptr());
        // SAFETY: valid session, run-options (or null) and binding pointers (the binding was created from this
        // session).
        let status = unsafe {
            (ort::api().RunWithBinding)(session.ptr().cast_mut(), run_options, self.binding.ptr())
        };
        // SAFETY: `status` was just returned by ONNX Runtime.
        unsafe { ort::Error::result_from_status(status) }
            .map_err(|e| ort_err("running a graph step", &e))?;
        if ids {
            copier.to_host(
                &self.argmax_dev,
                &mut self.argmax_host,
                "copying argmax to the host",
            )
        } else {
            copier.to_host(
                &self.logits_dev,
                &mut self.logits_host,
                "copying logits to the host",
            )
        }
    }

    /// `[rows]` argmax ids of the last [`GraphStep::run`] with `ids`.
    pub(crate) fn argmax(&self) -> &[i64] {
        // SAFETY: a host tensor of `rows` i64, alive as long as `self`.
        unsafe { std::slice::from_raw_parts(self.argmax_host.data_ptr().cast::<i64>(), self.rows) }
    }

    /// `[rows, vocab]` logits of the last [`GraphStep::run`] without `ids`.
    pub(crate) fn logits(&self, vocab: usize) -> &[f32] {
        // SAFETY: a host tensor of `rows * vocab` f32, alive as long as `self`.
        unsafe {
            std::slice::from_raw_parts(self.logits_host.data_ptr().cast::<f32>(), self.rows * vocab)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, address: usize, allocated: u64, rewritten: bool) -> BoundRecord {
        BoundRecord {
            name: name.into(),
            address,
            shape: vec![1, 4],
            allocated,
            rewritten_each_run: rewritten,
        }
    }

    #[test]
    fn graph_shapes_cover_draft_steps_verifications_and_the_catch_up() {
        assert!(is_graph_shape(1, 1) && is_graph_shape(9, 9) && is_graph_shape(16, 16));
        assert!(is_graph_shape(2, 1), "the draft's catch-up");
        assert!(!is_graph_shape(17, 17) && !is_graph_shape(5, 1) && !is_graph_shape(3, 2));
        let ids: Vec<usize> = graph_shapes().map(|(s, r)| graph_id(s, r)).collect();
        let mut unique = ids.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ids.len(), "graph ids are distinct: {ids:?}");
    }

    #[test]
    fn replays_with_the_captured_bindings_pass() {
        let mut ledger = ReplayLedger::new();
        let a = ledger.allocation();
        let b = ledger.allocation();
        let one = vec![
            rec("input_ids", 0x100, a, true),
            rec("logits_index", 0x200, a, false),
        ];
        let five = vec![
            rec("input_ids", 0x300, b, true),
            rec("logits_index", 0x400, b, false),
        ];
        for _ in 0..3 {
            ledger.check_run(1, &one).unwrap();
            ledger.check_run(5, &five).unwrap();
        }
        assert!(ledger.is_captured(1) && ledger.is_captured(5) && !ledger.is_captured(4));
    }

    #[test]
    fn a_tensor_moved_after_capture_is_refused() {
        let mut ledger = ReplayLedger::new();
        let a = ledger.allocation();
        ledger
            .check_run(1, &[rec("input_ids", 0x100, a, true)])
            .unwrap();
        let err = ledger
            .check_run(1, &[rec("input_ids", 0x180, a, true)])
            .unwrap_err();
        assert!(
            err.to_string().contains("input_ids is bound at 0x180"),
            "{err}"
        );
        let mut reshaped = rec("input_ids", 0x100, a, true);
        reshaped.shape = vec![1, 5];
        let err = ledger.check_run(1, &[reshaped]).unwrap_err();
        assert!(err.to_string().contains("shape [1, 5]"), "{err}");
    }

    #[test]
    fn a_persistent_input_allocated_after_a_capture_is_refused() {
        // A lazily created step: its logits_index (written once) allocated after graph 1 ran.
        let mut ledger = ReplayLedger::new();
        let a = ledger.allocation();
        ledger
            .check_run(1, &[rec("logits_index", 0x100, a, false)])
            .unwrap();
        let late = ledger.allocation();
        let err = ledger
            .check_run(4, &[rec("logits_index", 0x900, late, false)])
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("allocated after a graph was captured"),
            "{err}"
        );
        // An input rewritten before each run may be allocated late.
        ledger
            .check_run(4, &[rec("input_ids", 0x980, late, true)])
            .unwrap();
    }
}
