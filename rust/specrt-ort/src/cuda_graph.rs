//! CUDA graph capture and replay of the decode steps: the graph form (`specrt convert --attention gqa-graph`) on the
//! CUDA provider with [`crate::OrtOptions::cuda_graph`].
//!
//! ONNX Runtime's CUDA provider (session option `enable_cuda_graph`) captures a run into a CUDA graph and then
//! replays it, skipping hundreds of kernel launches per step, when every input and output of that run is bound to
//! device memory at the same address with the same shape; the run option `gpu_graph_id` names each captured shape
//! (`-1`: run without a graph). The graph form makes every per-call value a tensor: one [`GraphStep`] per step shape
//! `s` (`s` new tokens, logits of all `s`: a 1-token draft step, a K + 1-token verification; at most
//! [`MAX_GRAPH_TOKENS`]) owns device tensors for `input_ids`, `seqlens_k` and `logits_index`, writes the first two
//! before each run, binds `total_sequence_length` (a host input of GroupQueryAttention) to the cache capacity, and
//! binds `logits` / `argmax` to device tensors copied back after the run (only the one the caller reads). Prefill
//! chunks and other shapes run without a graph (`gpu_graph_id = -1`).
//!
//! Not yet run on a GPU (no device was lent to the session that wrote it): the CPU tests cover the graph form's
//! equality with the default form and the option checks; `shared/tools/gpu`-style checks must show capture works.

use ort::{
    memory::Allocator,
    session::{IoBinding, RunOptions, Session},
    value::{DynTensor, Tensor},
    AsPointer,
};
use specrt_core::{Result, SpecError};

use crate::backend::bind_kv_buffers;
use crate::runtime::ort_err;

/// Longest step (new tokens) run from a CUDA graph; longer calls (prefill chunks) run without one.
pub const MAX_GRAPH_TOKENS: usize = 16;

/// Run options of calls made without a graph in a graph-enabled session.
pub(crate) fn no_graph_options() -> Result<RunOptions> {
    let mut options = RunOptions::new().map_err(|e| ort_err("creating run options", &e))?;
    options
        .set("gpu_graph_id", "-1")
        .map_err(|e| ort_err("setting gpu_graph_id", &e))?;
    Ok(options)
}

/// Whether a call of `s` new tokens returning `n_logits` rows runs from a graph.
pub(crate) fn is_graph_shape(s: usize, n_logits: usize) -> bool {
    s == n_logits && s <= MAX_GRAPH_TOKENS
}

/// The fixed-address tensors and binding of one captured step shape.
pub(crate) struct GraphStep {
    binding: IoBinding,
    run_options: RunOptions,
    s: usize,
    ids_host: Tensor<i64>,
    ids_dev: Tensor<i64>,
    seqlens_host: Tensor<i32>,
    seqlens_dev: Tensor<i32>,
    _index_dev: Tensor<i64>,
    _total: Tensor<i32>,
    logits_dev: Tensor<f32>,
    logits_host: Tensor<f32>,
    argmax_dev: Tensor<i64>,
    argmax_host: Tensor<i64>,
}

impl GraphStep {
    /// Allocate and bind the step of `s` tokens (graph id `s`): `kv` are the shared KV buffers in
    /// `[l0.key, l0.value, l1.key, ...]` order (bound as past and present, as the main binding does), `device` the
    /// CUDA allocator, `max_seq_len` the cache capacity (`total_sequence_length`).
    ///
    /// Errors: [`SpecError::Backend`] for allocation or binding failures.
    pub(crate) fn new(
        session: &Session,
        device: &Allocator,
        kv: &mut [DynTensor],
        s: usize,
        vocab: usize,
        max_seq_len: usize,
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
        let mut index_dev = Tensor::<i64>::new(device, [s]).map_err(alloc_err("logits_index"))?;
        let mut index_host = Tensor::<i64>::new(host, [s]).map_err(alloc_err("logits_index"))?;
        for (i, v) in index_host.extract_tensor_mut().1.iter_mut().enumerate() {
            *v = i64::try_from(i).expect("s <= MAX_GRAPH_TOKENS");
        }
        index_host
            .copy_into(&mut index_dev)
            .map_err(|e| ort_err("copying logits_index to the device", &e))?;
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
            Tensor::<f32>::new(device, [1, s, vocab]).map_err(alloc_err("logits"))?;
        let mut argmax_dev = Tensor::<i64>::new(device, [1, s]).map_err(alloc_err("argmax"))?;
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
        let mut run_options = RunOptions::new().map_err(|e| ort_err("creating run options", &e))?;
        run_options
            .set("gpu_graph_id", s.to_string())
            .map_err(|e| ort_err("setting gpu_graph_id", &e))?;
        Ok(Self {
            binding,
            run_options,
            s,
            ids_host: Tensor::<i64>::new(host, [1, s]).map_err(alloc_err("input_ids"))?,
            ids_dev,
            seqlens_host: Tensor::<i32>::new(host, [1_usize]).map_err(alloc_err("seqlens_k"))?,
            seqlens_dev,
            _index_dev: index_dev,
            _total: total,
            logits_dev,
            logits_host: Tensor::<f32>::new(host, [1, s, vocab]).map_err(alloc_err("logits"))?,
            argmax_dev,
            argmax_host: Tensor::<i64>::new(host, [1, s]).map_err(alloc_err("argmax"))?,
        })
    }

    /// Run the step on `tokens` (`s` of them) after `n_past` cached positions: write the ids and `seqlens_k` to the
    /// device, run with this shape's graph id (ONNX Runtime captures on an early run and replays afterwards), and
    /// copy back the argmax ids (`ids`) or the logits. Read them with [`GraphStep::argmax`] / [`GraphStep::logits`].
    ///
    /// Errors: [`SpecError::Backend`] for copy or run failures.
    pub(crate) fn run(
        &mut self,
        session: &Session,
        tokens: &[u32],
        n_past: usize,
        ids: bool,
    ) -> Result<()> {
        debug_assert_eq!(tokens.len(), self.s);
        for (dst, &t) in self.ids_host.extract_tensor_mut().1.iter_mut().zip(tokens) {
            *dst = i64::from(t);
        }
        self.seqlens_host.extract_tensor_mut().1[0] =
            i32::try_from(n_past + self.s - 1).expect("max_seq_len fits in i32 (checked at load)");
        self.ids_host
            .copy_into(&mut self.ids_dev)
            .map_err(|e| ort_err("copying input_ids to the device", &e))?;
        self.seqlens_host
            .copy_into(&mut self.seqlens_dev)
            .map_err(|e| ort_err("copying seqlens_k to the device", &e))?;
        // SAFETY: valid session, run-options and binding pointers (the binding was created from this session).
        let status = unsafe {
            (ort::api().RunWithBinding)(
                session.ptr().cast_mut(),
                self.run_options.ptr(),
                self.binding.ptr(),
            )
        };
        // SAFETY: `status` was just returned by ONNX Runtime.
        unsafe { ort::Error::result_from_status(status) }
            .map_err(|e| ort_err("running a graph step", &e))?;
        if ids {
            self.argmax_dev
                .copy_into(&mut self.argmax_host)
                .map_err(|e| ort_err("copying argmax to the host", &e))
        } else {
            self.logits_dev
                .copy_into(&mut self.logits_host)
                .map_err(|e| ort_err("copying logits to the host", &e))
        }
    }

    /// `[s]` argmax ids of the last [`GraphStep::run`] with `ids`.
    pub(crate) fn argmax(&self) -> &[i64] {
        // SAFETY: a host tensor of `s` i64, alive as long as `self`.
        unsafe { std::slice::from_raw_parts(self.argmax_host.data_ptr().cast::<i64>(), self.s) }
    }

    /// `[s, vocab]` logits of the last [`GraphStep::run`] without `ids`.
    pub(crate) fn logits(&self, vocab: usize) -> &[f32] {
        // SAFETY: a host tensor of `s * vocab` f32, alive as long as `self`.
        unsafe {
            std::slice::from_raw_parts(self.logits_host.data_ptr().cast::<f32>(), self.s * vocab)
        }
    }
}
