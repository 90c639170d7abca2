//! [`OrtBackend`]: one ONNX decoder in one ONNX Runtime session, implementing [`specrt_core::backend::Backend`].
//!
//! Per call nothing large is allocated in the shared-buffer layout: the KV buffers are bound once as both
//! `past_key_values.{i}.*` input and `present.{i}.*` output (the same `OrtValue`, via `view_mut().try_upgrade()`),
//! the small int64 inputs are views of preallocated buffers, and the logits go to a reused tensor per row count.

use std::path::{Path, PathBuf};

use ort::{
    ep,
    memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType},
    session::{builder::GraphOptimizationLevel, builder::SessionBuilder, IoBinding, Session},
    value::{
        DynTensor, DynValue, IntoShape, PrimitiveTensorElementType, Tensor, TensorElementType,
        TensorRef, ValueType,
    },
    AsPointer,
};
use specrt_core::subset::VocabSubset;
use specrt_core::{backend::Backend, Result, SpecError};

use crate::cuda_graph::{
    graph_id, graph_shapes, is_graph_shape, no_graph_options, Copier, GraphStep, ReplayLedger,
    MAX_GRAPH_TOKENS,
};
use crate::kv_binding::bind_kv_buffers;
use crate::model::{
    analyze, check_min_onnxruntime, choose_max_seq_len, past_name, present_name,
    resolve_model_file, DecoderIo, SpecrtConfig, TensorDesc,
};
use crate::options::{KvLayout, Memory, MemoryPlan, OrtOptions, Provider, DEFAULT_MAX_SEQ_LEN};
use crate::runtime::{
    cuda_provider_library_path, init_runtime, init_runtime_with_threads, ort_err,
    CUDA_PROVIDER_LIBRARY,
};

/// Logits tensors kept for reuse, keyed by row count (a decode loop uses a few: 1, K + 1, the prefill's rows).
const LOGITS_CACHE_ENTRIES: usize = 4;

/// Name of an element type as used in messages and [`DecoderIo::kv_dtype`].
fn dtype_name(ty: TensorElementType) -> String {
    match ty {
        TensorElementType::Float32 => "float32".into(),
        TensorElementType::Float16 => "float16".into(),
        TensorElementType::Bfloat16 => "bfloat16".into(),
        TensorElementType::Int64 => "int64".into(),
        TensorElementType::Int32 => "int32".into(),
        other => other.to_string(),
    }
}

pub(crate) fn describe(outlets: &[ort::value::Outlet]) -> Vec<TensorDesc> {
    outlets
        .iter()
        .map(|o| match o.dtype() {
            ValueType::Tensor {
                ty,
                shape,
                dimension_symbols,
            } => TensorDesc {
                name: o.name().to_string(),
                dtype: dtype_name(*ty),
                shape: shape.iter().copied().collect(),
                symbols: dimension_symbols.iter().cloned().collect(),
            },
            other => TensorDesc {
                name: o.name().to_string(),
                dtype: format!("{other:?}"),
                shape: Vec::new(),
                symbols: Vec::new(),
            },
        })
        .collect()
}

/// Names of the session's overridable initializers (initializers that are also graph inputs, e.g. the contract's
/// `num_logits_to_keep`): ONNX Runtime does not list them among the inputs, but they can be fed and bound.
pub(crate) fn overridable_initializers(session: &Session) -> Result<Vec<String>> {
    let api = ort::api();
    let status_err = |what: &str, status: ort::sys::OrtStatusPtr| {
        // SAFETY: `status` was just returned by an ONNX Runtime API call.
        unsafe { ort::Error::result_from_status(status) }.map_err(|e| ort_err(what, &e))
    };
    let mut count = 0usize;
    // SAFETY: valid session pointer, valid out pointer.
    status_err("SessionGetOverridableInitializerCount", unsafe {
        (api.SessionGetOverridableInitializerCount)(session.ptr(), &raw mut count)
    })?;
    let mut allocator: *mut ort::sys::OrtAllocator = std::ptr::null_mut();
    // SAFETY: the default allocator is a process-wide singleton, never freed.
    status_err("GetAllocatorWithDefaultOptions", unsafe {
        (api.GetAllocatorWithDefaultOptions)(&raw mut allocator)
    })?;
    let mut names = Vec::with_capacity(count);
    for index in 0..count {
        let mut name: *mut std::ffi::c_char = std::ptr::null_mut();
        // SAFETY: index < count; the name is allocated with `allocator` and freed below.
        status_err("SessionGetOverridableInitializerName", unsafe {
            (api.SessionGetOverridableInitializerName)(
                session.ptr(),
                index,
                allocator,
                &raw mut name,
            )
        })?;
        if !name.is_null() {
            // SAFETY: ONNX Runtime returns a NUL-terminated string.
            names.push(
                unsafe { std::ffi::CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned(),
            );
            // SAFETY: allocated by `allocator` above.
            let _ = status_err("AllocatorFree", unsafe {
                (api.AllocatorFree)(allocator, name.cast())
            });
        }
    }
    Ok(names)
}

/// Register the CUDA execution provider on `builder`, failing loudly (ort's default is to fail silently and run on
/// the CPU).
fn register_cuda(
    builder: SessionBuilder,
    device_id: i32,
    cuda_graph: bool,
) -> Result<SessionBuilder> {
    builder
        .with_execution_providers([ep::CUDA::default()
            .with_device_id(device_id)
            .with_cuda_graph(cuda_graph)
            .build()
            .error_on_failure()])
        .map_err(|e| {
            SpecError::Provider(format!(
                "CUDA execution provider could not be registered (device {device_id}): {} (check the CUDA driver \
                 with nvidia-smi, that cuDNN 9 and the CUDA runtime are installed, e.g. by pip install 'specrt[cuda]': \
                 specrt's Python package preloads them from site-packages/nvidia/*/lib before the session is made; \
                 `specrt env` names what is missing)",
                e.message()
            ))
        })
}

/// Check, without a model, that the CUDA execution provider can be registered with the library at `ort_library`.
///
/// Errors: [`SpecError::Provider`] naming the missing piece (no `libonnxruntime_providers_cuda.so` beside the
/// library, i.e. the CPU wheel is installed; driver, CUDA runtime or cuDNN missing), or the errors of
/// [`init_runtime`].
pub fn check_cuda_provider(ort_library: &Path, device_id: i32) -> Result<()> {
    init_runtime(ort_library)?;
    check_cuda_library_present()?;
    let builder = Session::builder().map_err(|e| ort_err("creating session options", &e))?;
    register_cuda(builder, device_id, false).map(|_| ())
}

fn check_cuda_library_present() -> Result<()> {
    let lib = cuda_provider_library_path()
        .ok_or_else(|| SpecError::Internal("ONNX Runtime not loaded".into()))?;
    if lib.is_file() {
        Ok(())
    } else {
        Err(SpecError::Provider(format!(
            "CUDA execution provider library not found: {} (the installed ONNX Runtime has no {CUDA_PROVIDER_LIBRARY}; \
             this is the CPU build of ONNX Runtime: pip uninstall onnxruntime, then pip install 'specrt[cuda]')",
            lib.display()
        )))
    }
}

/// Build the session for `provider`. Errors for a CUDA request are [`SpecError::Provider`].
pub(crate) fn build_session(
    model_file: &Path,
    options: &OrtOptions,
    provider: Provider,
) -> Result<Session> {
    let ctx = |what: &'static str| move |e: ort::Error<SessionBuilder>| ort_err(what, &e);
    let mut builder = Session::builder()
        .map_err(|e| ort_err("creating session options", &e))?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(ctx("setting the graph optimization level"))?
        .with_intra_threads(options.effective_intra_op_threads())
        .map_err(ctx("setting intra-op threads"))?
        .with_inter_threads(options.inter_op_threads)
        .map_err(ctx("setting inter-op threads"))?
        .with_parallel_execution(false)
        .map_err(ctx("setting sequential execution"))?
        .with_operators(crate::ops::operators(options.effective_intra_op_threads())?)
        .map_err(ctx("registering specrt's operators"))?;
    if let Some(prefix) = &options.profile {
        builder = builder
            .with_profiling(prefix)
            .map_err(ctx("enabling the profiler"))?;
    }
    if provider == Provider::Cuda {
        check_cuda_library_present()?;
        builder = register_cuda(builder, options.device_id, options.cuda_graph)?;
    }
    // One load at a time in the process: loading registers specrt's operator domain in ONNX Runtime's registry of
    // domains, which two concurrent loads can both try to add ("Trying to add a domain to DomainToVersion map, but
    // the domain is already exist", seen once in `make test-rs` with tests loading models on parallel threads).
    static LOADING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_load = LOADING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    builder.commit_from_file(model_file).map_err(|e| {
        let message = e.message();
        let lower = message.to_ascii_lowercase();
        if provider == Provider::Cuda
            && (e.code() == ort::ErrorCode::ExecutionProviderFailure
                || lower.contains("cuda")
                || lower.contains("cudnn"))
        {
            SpecError::Provider(format!(
                "CUDA execution provider failed while loading {}: {message}",
                model_file.display()
            ))
        } else if e.code() == ort::ErrorCode::NoSuchFile {
            SpecError::NotFound(format!(
                "cannot load model {}: {message}",
                model_file.display()
            ))
        } else if matches!(
            e.code(),
            ort::ErrorCode::InvalidProtobuf | ort::ErrorCode::NoModel
        ) {
            SpecError::ModelFormat(format!(
                "cannot load model {}: {message}",
                model_file.display()
            ))
        } else {
            ort_err(&format!("loading model {}", model_file.display()), &e)
        }
    })
}

/// A CPU session of the prefill graph `file` named by a model's `specrt_config.json` ([`SpecError::NotFound`] naming
/// it when it is missing), with its contract as read by `analyze` from its inputs, outputs and overridable
/// initializers (an error of `analyze` becomes a [`SpecError::ModelFormat`] naming the file).
pub(crate) fn prefill_session<T>(
    file: &Path,
    options: &OrtOptions,
    analyze: impl FnOnce(&[TensorDesc], &[TensorDesc], &[String]) -> Result<T>,
) -> Result<(Session, T)> {
    if !file.is_file() {
        return Err(SpecError::NotFound(format!(
            "the prefill graph {} named by specrt_config.json is missing",
            file.display()
        )));
    }
    let session = build_session(file, options, Provider::Cpu)?;
    let found = analyze(
        &describe(session.inputs()),
        &describe(session.outputs()),
        &overridable_initializers(&session)?,
    )
    .map_err(|e| SpecError::ModelFormat(format!("prefill graph {}: {e}", file.display())))?;
    Ok((session, found))
}

/// Load a model's prefill graph (CPU) and bind the model's shared KV `buffers` as its past and present: it must have
/// the model's contract (layers, KV shape and type, logits width, the same inputs).
fn load_prefill_graph(
    file: &Path,
    min_tokens: usize,
    options: &OrtOptions,
    config: &SpecrtConfig,
    io: &DecoderIo,
    buffers: &mut [DynTensor],
) -> Result<PrefillGraph> {
    let (session, found) = prefill_session(file, options, |inputs, outputs, overridable| {
        analyze(inputs, outputs, overridable, config, options.layout)
    })?;
    let shape = |x: &DecoderIo| {
        (
            x.layout,
            x.n_layers,
            x.kv_heads,
            x.head_dim,
            x.kv_dtype.clone(),
            x.vocab_size,
            (
                x.has_attention_mask,
                x.has_position_ids,
                x.has_num_logits_to_keep,
            ),
        )
    };
    if shape(&found) != shape(io) {
        return Err(SpecError::ModelFormat(format!(
            "prefill graph {}: its interface {:?} differs from the model's {:?}",
            file.display(),
            shape(&found),
            shape(io)
        )));
    }
    let mut binding = session
        .create_binding()
        .map_err(|e| ort_err("creating the prefill graph's IO binding", &e))?;
    bind_kv_buffers(&mut binding, buffers)?;
    Ok(PrefillGraph {
        binding,
        logits: Vec::new(),
        logits_bound: Bound::No,
        argmax: Vec::new(),
        argmax_bound: Bound::No,
        session,
        min_tokens,
    })
}

/// How an output of the main binding is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bound {
    /// Not bound, or bound to a reused tensor that has since been evicted: bind before the next run.
    No,
    /// To the reused host tensor of this many rows.
    Host(usize),
    /// Left to ONNX Runtime on the provider's device, allocated at this many rows by the last run.
    Device(usize),
}

/// Bind output `name` to the reused host tensor of `rows` rows in `cache` (allocated with `shape` from `alloc` on
/// first use, most recently used last, the least recently used evicted beyond [`LOGITS_CACHE_ENTRIES`]), unless
/// `bound` says it is bound already.
fn bind_host_output<T: PrimitiveTensorElementType + std::fmt::Debug>(
    binding: &mut IoBinding,
    alloc: &Allocator,
    cache: &mut Vec<(usize, Tensor<T>)>,
    bound: &mut Bound,
    name: &str,
    rows: usize,
    shape: impl IntoShape,
) -> Result<()> {
    if let Some(pos) = cache.iter().position(|(r, _)| *r == rows) {
        let entry = cache.remove(pos);
        cache.push(entry);
    } else {
        if cache.len() == LOGITS_CACHE_ENTRIES {
            // The evicted tensor may be the bound one: rebind below in any case.
            cache.remove(0);
            *bound = Bound::No;
        }
        let tensor = Tensor::<T>::new(alloc, shape)
            .map_err(|e| ort_err(&format!("allocating {name} with {rows} rows"), &e))?;
        cache.push((rows, tensor));
    }
    if *bound != Bound::Host(rows) {
        let (_, tensor) = cache.last_mut().expect("pushed above");
        let alias = tensor
            .view_mut()
            .try_upgrade()
            .map_err(|_| SpecError::Internal(format!("{name} view is not upgradable")))?;
        binding
            .bind_output(name, alias)
            .map_err(|e| ort_err(&format!("binding {name}"), &e))?;
        *bound = Bound::Host(rows);
    }
    Ok(())
}

/// A CPU fallback's reason, noting that CUDA graphs went with the CUDA provider when they were asked for.
fn with_graph_note(reason: String, options: &OrtOptions) -> String {
    if options.cuda_graph {
        format!("{reason} (cuda_graph is off: CUDA graphs need the CUDA provider)")
    } else {
        reason
    }
}

/// State of the KV cache, per layout.
enum KvState {
    /// One `[1, kv_heads, max_seq_len, head_dim]` buffer per past/present pair, in `[l0.key, l0.value, l1.key, ...]`
    /// order, bound once as input and output.
    Shared { buffers: Vec<DynTensor> },
    /// The last `present.*` outputs (`[1, kv_heads, n_cached, head_dim]`, same order), which become the next past;
    /// `empty` are zero-length pasts for `n_past == 0`.
    Optimum {
        pasts: Vec<Option<DynValue>>,
        empty: Vec<DynTensor>,
    },
}

/// A model's prefill graph ([`OrtOptions::prefill_graph`]) with its own binding over the model's KV buffers, and
/// its own output tensors. While a long pass runs, these fields are swapped with the backend's (see
/// [`OrtBackend::swap_prefill`]), so one code path binds and runs either graph.
///
/// Field order is drop order: the binding goes first, the session last.
struct PrefillGraph {
    binding: IoBinding,
    logits: Vec<(usize, Tensor<f32>)>,
    logits_bound: Bound,
    argmax: Vec<(usize, Tensor<i64>)>,
    argmax_bound: Bound,
    session: Session,
    /// Passes of at least this many new tokens run on it.
    min_tokens: usize,
}

/// One decoder model in one ONNX Runtime session (see the crate docs for the layouts).
///
/// Field order is drop order: the graph steps and bindings (which reference the buffers, and whose device tensors
/// are freed through the KV allocator) go first, the allocator and the session last.
pub struct OrtBackend {
    /// CUDA graphs on ([`OrtOptions::cuda_graph`]) or their CPU mode ([`OrtOptions::cpu_graph_steps`]): the step
    /// shapes, and the run options of the other calls (`gpu_graph_id = -1`).
    graphs: Option<Graphs>,
    prefill: Option<PrefillGraph>,
    binding: IoBinding,
    kv: KvState,
    /// Reused logits tensors `[1, rows, vocab]` f32 in plain host memory (all providers), most recent last.
    logits: Vec<(usize, Tensor<f32>)>,
    /// How `logits` is bound.
    logits_bound: Bound,
    /// `[max_seq_len]` int64: the current call's token ids in the first S entries.
    ids: Box<[i64]>,
    /// `[max_seq_len]` int64 ones; the attention mask is a view of the first `n_past + S`.
    ones: Box<[i64]>,
    /// `[max_seq_len]` int64 `0, 1, 2, ...`; `position_ids` is the view `[n_past, n_past + S)`.
    positions: Box<[i64]>,
    /// `[1]` int64: `num_logits_to_keep`.
    n_keep: Box<[i64]>,
    /// `[2]` int32: `seqlens_k` then `total_sequence_length` (the graph form's inputs).
    seq: Box<[i32]>,
    /// Reused `argmax` output tensors `[1, rows]` int64 in host memory (the graph form), most recent last.
    argmax: Vec<(usize, Tensor<i64>)>,
    /// How `argmax` is bound.
    argmax_bound: Bound,
    /// CUDA device ordinal (outputs that are not read are left on this device).
    device_id: i32,
    /// ONNX Runtime's profiler: `None` off, `Some(true)` on, `Some(false)` ended.
    profiling: Option<bool>,
    /// `forward_argmax` reads the model's `argmax` output ([`OrtOptions::device_argmax`] resolved).
    use_argmax_output: bool,
    _kv_allocator: Option<Allocator>,
    session: Session,
    io: DecoderIo,
    max_seq_len: usize,
    /// Positions with valid KV after the last call (`n_past + S` of that call).
    n_cached: usize,
    provider: Provider,
    fallback_reason: Option<String>,
    model_file: PathBuf,
    /// A pruned-vocabulary model: its `[rows, N]` logits are expanded to `[rows, vocab]` (`-inf` outside).
    subset: Option<VocabSubset>,
}

/// The CUDA-graph state of a backend.
struct Graphs {
    /// `steps[graph_id(s, rows)]`: every step shape of [`graph_shapes`], created when the backend loads (before any
    /// capture: `crate::cuda_graph`'s second invariant).
    steps: Vec<Option<GraphStep>>,
    /// The replay invariants, checked before every step run.
    ledger: ReplayLedger,
    /// How the steps copy inputs and outputs.
    copier: Copier,
    /// Run options of calls made without a graph (CUDA; `None` in the CPU mode).
    no_graph: Option<ort::session::RunOptions>,
    /// The step the last call ran from (`None`: the main binding).
    last: Option<usize>,
}

impl OrtBackend {
    /// Load a model for decoding.
    ///
    /// `model` is a model folder (holding `model.onnx` and, optionally, `specrt_config.json`) or an `.onnx` file.
    /// Loads ONNX Runtime from `options.ort_library` first (once per process), builds one session, detects the KV
    /// layout, and for the shared-buffer layout allocates the KV cache once
    /// (`2 * n_layers` tensors `[1, kv_heads, max_seq_len, head_dim]` on the provider's device).
    ///
    /// Errors: [`SpecError::Setting`] for invalid options (named); [`SpecError::ModelFormat`] for a model that does
    /// not follow a supported decoder layout, or a corrupt model or config; [`SpecError::NotFound`] for a missing
    /// library or model file; [`SpecError::Io`] for an unreadable one;
    /// [`SpecError::Provider`] when CUDA was requested and cannot be used (unless `allow_fallback`);
    /// [`SpecError::Backend`] for other ONNX Runtime failures (library load, session creation, allocation).
    pub fn new(model: impl AsRef<Path>, options: &OrtOptions) -> Result<Self> {
        options.validate()?;
        init_runtime_with_threads(&options.ort_library, options.effective_intra_op_threads())?;
        let model_file = resolve_model_file(model.as_ref())?;
        let config = SpecrtConfig::read_beside(&model_file)?;
        check_min_onnxruntime(&config, &crate::runtime::loaded_version()?, &model_file)?;

        let (session, provider, fallback_reason) =
            match build_session(&model_file, options, options.provider) {
                Ok(session) => (session, options.provider, None),
                Err(SpecError::Provider(reason)) if options.allow_fallback => (
                    build_session(&model_file, options, Provider::Cpu)?,
                    Provider::Cpu,
                    Some(reason),
                ),
                Err(e) => return Err(e),
            };
        // A fallback says what it dropped.
        let fallback_reason = fallback_reason.map(|r| with_graph_note(r, options));
        match Self::with_session(session, &model_file, &config, options, provider) {
            Err(SpecError::Provider(reason))
                if options.allow_fallback && provider == Provider::Cuda =>
            {
                let session = build_session(&model_file, options, Provider::Cpu)?;
                let mut backend =
                    Self::with_session(session, &model_file, &config, options, Provider::Cpu)?;
                backend.fallback_reason = Some(with_graph_note(reason, options));
                Ok(backend)
            }
            Ok(mut backend) => {
                backend.fallback_reason = fallback_reason;
                Ok(backend)
            }
            Err(e) => Err(e),
        }
    }

    fn with_session(
        session: Session,
        model_file: &Path,
        config: &SpecrtConfig,
        options: &OrtOptions,
        provider: Provider,
    ) -> Result<Self> {
        let inputs = describe(session.inputs());
        let outputs = describe(session.outputs());
        let overridable = overridable_initializers(&session)?;
        let io = analyze(&inputs, &outputs, &overridable, config, options.layout)?;
        let max_seq_len = choose_max_seq_len(
            options.max_seq_len,
            config,
            io.static_kv_len,
            DEFAULT_MAX_SEQ_LEN,
        )?;
        let kv_type = match io.kv_dtype.as_str() {
            "float32" => TensorElementType::Float32,
            "float16" => TensorElementType::Float16,
            "bfloat16" => TensorElementType::Bfloat16,
            other => {
                return Err(SpecError::ModelFormat(format!(
                    "KV cache type {other} is not supported"
                )))
            }
        };

        let plan = MemoryPlan::for_provider(provider);
        let kv_allocator = if plan.kv_cache == Memory::CudaDevice {
            if io.layout == KvLayout::Optimum {
                return Err(SpecError::setting(
                    "provider",
                    format!(
                    "{} uses the Optimum KV layout, which specrt runs on the CPU provider only (convert it with \
                     `specrt convert` for CUDA)",
                    model_file.display()
                )));
            }
            if kv_type == TensorElementType::Float32 {
                return Err(SpecError::setting(
                    "provider",
                    format!(
                    "{} has a float32 KV cache; GroupQueryAttention has no float32 CUDA kernel (expected a float16 or \
                     bfloat16 model for CUDA)",
                    model_file.display()
                )));
            }
            // Creating the device allocator proves the session really runs the CUDA provider.
            let device = MemoryInfo::new(AllocationDevice::CUDA, options.device_id, AllocatorType::Device, MemoryType::Default)
                .and_then(|info| Allocator::new(&session, info))
                .map_err(|e| {
                    SpecError::Provider(format!(
                        "the session has no CUDA allocator for device {} (CUDA provider not active): {}",
                        options.device_id,
                        e.message()
                    ))
                })?;
            // Logits go to plain host memory (the session's CPU allocator), never CUDA-pinned memory: on
            // onnxruntime-gpu 1.31 (CUDA 13) an output bound to a CUDA_PINNED tensor fails the first run with
            // "GPUDataTransfer::CopyTensorAsync ... dst_data != src_data" (a host-to-host self-copy that the CUDA
            // data transfer refuses; onnxruntime issue #29713, fix proposed in PR #29792). See
            // `MemoryPlan::for_provider` and the `gpu` tests that run every choice made here.
            Some(device)
        } else {
            None
        };

        let mut binding = session
            .create_binding()
            .map_err(|e| ort_err("creating the IO binding", &e))?;
        let kv_shape = [1, io.kv_heads, max_seq_len, io.head_dim];
        let mut kv = match io.layout {
            KvLayout::SharedBuffer => {
                let alloc = kv_allocator.as_ref().unwrap_or_else(|| session.allocator());
                // One zeroed host tensor of the KV shape, copied into each device buffer once (CUDA only).
                let host_zeros = match kv_allocator {
                    Some(_) => Some(
                        DynTensor::new(session.allocator(), kv_type, kv_shape)
                            .map_err(|e| ort_err("allocating host zeros", &e))?,
                    ),
                    None => None,
                };
                let mut buffers = Vec::with_capacity(2 * io.n_layers);
                for layer in 0..io.n_layers {
                    for kind in ["key", "value"] {
                        let mut buffer = DynTensor::new(alloc, kv_type, kv_shape).map_err(|e| {
                            ort_err(
                                &format!("allocating the KV buffer {kv_shape:?} of layer {layer}"),
                                &e,
                            )
                        })?;
                        if let Some(zeros) = &host_zeros {
                            // Device memory is not zeroed by ort (host memory is): never let stale bytes (maybe
                            // NaN patterns) sit in rows an attention kernel might touch.
                            zeros
                                .copy_into(&mut buffer)
                                .map_err(|e| ort_err("zeroing a device KV buffer", &e))?;
                        }
                        binding
                            .bind_input(past_name(layer, kind), &buffer)
                            .map_err(|e| ort_err("binding a past KV input", &e))?;
                        let alias = buffer.view_mut().try_upgrade().map_err(|_| {
                            SpecError::Internal("KV buffer view is not upgradable".into())
                        })?;
                        binding
                            .bind_output(present_name(layer, kind), alias)
                            .map_err(|e| ort_err("binding a present KV output", &e))?;
                        buffers.push(buffer);
                    }
                }
                KvState::Shared { buffers }
            }
            KvLayout::Optimum => {
                let cpu = MemoryInfo::new(
                    AllocationDevice::CPU,
                    0,
                    AllocatorType::Device,
                    MemoryType::CPUOutput,
                )
                .map_err(|e| ort_err("creating CPU memory info", &e))?;
                let mut empty = Vec::with_capacity(2 * io.n_layers);
                for layer in 0..io.n_layers {
                    for kind in ["key", "value"] {
                        binding
                            .bind_output_to_device(present_name(layer, kind), &cpu)
                            .map_err(|e| ort_err("binding a present KV output", &e))?;
                        empty.push(
                            DynTensor::new(
                                session.allocator(),
                                kv_type,
                                [1, io.kv_heads, 0, io.head_dim],
                            )
                            .map_err(|e| ort_err("allocating an empty past", &e))?,
                        );
                    }
                }
                KvState::Optimum {
                    pasts: (0..2 * io.n_layers).map(|_| None).collect(),
                    empty,
                }
            }
            KvLayout::BatchedRows => {
                // `analyze` refuses the batched contract; kept as an error, never a panic.
                return Err(SpecError::ModelFormat(format!(
                    "{} holds the batched decoder contract (kv_layout batched_rows), which runs on \
                     BatchedOrtBackend only",
                    model_file.display()
                )));
            }
        };
        let max_i64 = i64::try_from(max_seq_len).map_err(|_| {
            SpecError::setting(
                "max_seq_len",
                format!("max_seq_len {max_seq_len} is too large"),
            )
        })?;
        if io.has_sequence_inputs && i32::try_from(max_seq_len).is_err() {
            return Err(SpecError::setting(
                "max_seq_len",
                format!(
                    "max_seq_len {max_seq_len} is too large for the graph form's int32 sequence lengths"
                ),
            ));
        }

        let subset = config.vocab_subset_for(io.vocab_size, model_file)?;
        // Checked on every provider, so that a CPU fallback does not hide a model CUDA graphs cannot run.
        if (options.cuda_graph || options.cpu_graph_steps)
            && !(io.has_sequence_inputs && io.has_logits_index && io.has_argmax)
        {
            let option = if options.cuda_graph {
                "cuda_graph"
            } else {
                "cpu_graph_steps"
            };
            return Err(SpecError::setting(
                option,
                format!(
                "{option} needs a model in the graph form (seqlens_k, total_sequence_length and logits_index \
                 inputs, an argmax output); {} is not: convert it with `specrt convert --attention gqa-graph`",
                model_file.display()
            )));
        }
        let graph_steps = (options.cuda_graph && provider == Provider::Cuda)
            || (options.cpu_graph_steps && provider == Provider::Cpu);
        let graphs = match (&mut kv, graph_steps) {
            (KvState::Shared { buffers }, true) => {
                let cuda = provider == Provider::Cuda;
                let copier = Copier::for_device(!cuda);
                let mut ledger = ReplayLedger::new();
                let device = kv_allocator.as_ref().unwrap_or_else(|| session.allocator());
                let mut steps: Vec<Option<GraphStep>> =
                    (0..=2 * MAX_GRAPH_TOKENS).map(|_| None).collect();
                for shape in graph_shapes() {
                    steps[graph_id(shape.0, shape.1)] = Some(GraphStep::new(
                        &session,
                        device,
                        buffers,
                        shape,
                        io.vocab_size,
                        max_seq_len,
                        cuda,
                        &mut ledger,
                        &copier,
                    )?);
                }
                Some(Graphs {
                    steps,
                    ledger,
                    copier,
                    no_graph: if cuda {
                        Some(no_graph_options()?)
                    } else {
                        None
                    },
                    last: None,
                })
            }
            (_, true) => {
                return Err(SpecError::ModelFormat(format!(
                    "graph steps need the shared-buffer KV layout; {} has another",
                    model_file.display()
                )))
            }
            _ => None,
        };
        let use_argmax_output = io.has_argmax
            && (io.has_logits_index || io.has_num_logits_to_keep)
            && options.device_argmax.unwrap_or(provider == Provider::Cuda);
        // The prefill graph: CPU, the shared-buffer default form (what `specrt convert --prefill-graph` writes).
        let prefill = match (&config.prefill_graph, &mut kv) {
            (Some((file, min)), KvState::Shared { buffers })
                if options.prefill_graph
                    && provider == Provider::Cpu
                    && !io.has_sequence_inputs
                    && graphs.is_none() =>
            {
                Some(load_prefill_graph(
                    file, *min, options, config, &io, buffers,
                )?)
            }
            _ => None,
        };
        let backend = OrtBackend {
            graphs,
            prefill,
            binding,
            kv,
            logits: Vec::new(),
            logits_bound: Bound::No,
            ids: vec![0; max_seq_len].into_boxed_slice(),
            ones: vec![1; max_seq_len].into_boxed_slice(),
            positions: (0..max_i64).collect(),
            n_keep: vec![0].into_boxed_slice(),
            seq: vec![0; 2].into_boxed_slice(),
            argmax: Vec::new(),
            argmax_bound: Bound::No,
            device_id: options.device_id,
            profiling: options.profile.as_ref().map(|_| true),
            use_argmax_output,
            _kv_allocator: kv_allocator,
            session,
            io,
            max_seq_len,
            n_cached: 0,
            provider,
            fallback_reason: None,
            model_file: model_file.to_path_buf(),
            subset,
        };
        Ok(backend)
    }

    /// The KV layout in use: [`KvLayout::SharedBuffer`] (the specrt contract) or [`KvLayout::Optimum`].
    pub fn layout(&self) -> KvLayout {
        self.io.layout
    }

    /// Where the KV cache, the logits and the per-call inputs live ([`MemoryPlan::for_provider`] of
    /// [`Self::provider`]).
    pub fn memory_plan(&self) -> MemoryPlan {
        MemoryPlan::for_provider(self.provider)
    }

    /// The provider the session really runs on (CPU after a CUDA fallback).
    pub fn provider(&self) -> Provider {
        self.provider
    }

    /// ONNX Runtime names of the session's providers, preferred first (e.g.
    /// `["CUDAExecutionProvider", "CPUExecutionProvider"]`).
    pub fn providers(&self) -> Vec<&'static str> {
        match self.provider {
            Provider::Cpu => vec![Provider::Cpu.ort_name()],
            Provider::Cuda => vec![Provider::Cuda.ort_name(), Provider::Cpu.ort_name()],
        }
    }

    /// Why CUDA was not used, when the options allowed a fallback to CPU and it happened.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    /// The decoder interface found in the model (layers, KV heads, head size, KV dtype, optional inputs).
    pub fn decoder_io(&self) -> &DecoderIo {
        &self.io
    }

    /// The model file this backend runs.
    pub fn model_file(&self) -> &Path {
        &self.model_file
    }

    /// Positions with valid KV after the last call (`n_past + tokens.len()` of that call; 0 before any call).
    pub fn n_cached(&self) -> usize {
        self.n_cached
    }

    /// Addresses of the KV tensors' data (`[l0.key, l0.value, l1.key, ...]`): for the shared-buffer layout these
    /// never change (the cache is allocated once); for the Optimum layout they are the current pasts (0 if none).
    /// For tests and diagnostics.
    pub fn kv_buffer_addresses(&self) -> Vec<usize> {
        match &self.kv {
            KvState::Shared { buffers } => buffers.iter().map(|b| b.data_ptr() as usize).collect(),
            KvState::Optimum { pasts, .. } => pasts
                .iter()
                .map(|p| {
                    p.as_ref().map_or(0, |v| {
                        v.downcast_ref::<ort::value::DynTensorValueType>()
                            .map_or(0, |t| t.data_ptr() as usize)
                    })
                })
                .collect(),
        }
    }

    /// End ONNX Runtime's profiling ([`OrtOptions::profile`]) and return the trace file it wrote.
    ///
    /// Errors: [`SpecError::Config`] if the backend was created without `profile`; [`SpecError::Backend`] if ONNX
    /// Runtime fails to write the file.
    pub fn end_profiling(&mut self) -> Result<PathBuf> {
        match self.profiling {
            None => {
                return Err(SpecError::Config(
                    "profiling is off for this model (create it with the profile option)".into(),
                ))
            }
            Some(false) => {
                return Err(SpecError::Config(
                    "profiling already ended for this model (end_profiling is called once)".into(),
                ))
            }
            Some(true) => self.profiling = Some(false),
        }
        let path = self
            .session
            .end_profiling()
            .map(PathBuf::from)
            .map_err(|e| ort_err("ending the profiler", &e))?;
        if path.is_file() {
            Ok(path)
        } else {
            Err(SpecError::Backend {
                code: "NoSuchFile".into(),
                message: format!("ONNX Runtime's profiler did not write {}", path.display()),
            })
        }
    }

    /// Address of the logits data returned by the last call (0 before any call). For tests and diagnostics.
    pub fn logits_address(&self) -> usize {
        self.logits.last().map_or(0, |(_, t)| t.data_ptr() as usize)
    }

    fn validate(&self, tokens: &[u32], n_past: usize, n_logits: usize) -> Result<()> {
        let s = tokens.len();
        if s == 0 {
            return Err(SpecError::Config(
                "tokens is empty (expected at least 1 token)".into(),
            ));
        }
        if n_logits == 0 || n_logits > s {
            return Err(SpecError::Config(format!(
                "n_logits {n_logits} is invalid (expected 1 <= n_logits <= number of tokens {s})"
            )));
        }
        if n_past + s > self.max_seq_len {
            return Err(SpecError::Length(format!(
                "n_past {n_past} + {s} tokens = {} exceeds max_seq_len {}",
                n_past + s,
                self.max_seq_len
            )));
        }
        if n_past > self.n_cached {
            return Err(SpecError::Config(format!(
                "n_past {n_past} exceeds the {} positions cached by previous calls",
                self.n_cached
            )));
        }
        // Input ids index the full embedding, also for a pruned-vocabulary model.
        let vocab = self
            .subset
            .as_ref()
            .map_or(self.io.vocab_size, VocabSubset::full_vocab);
        if let Some((i, &t)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= vocab)
        {
            return Err(SpecError::Vocab(format!(
                "token {t} at index {i} is out of range (vocab size {vocab})"
            )));
        }
        Ok(())
    }

    /// Whether the model's prefill graph is loaded, and the fewest new tokens a pass needs to run on it.
    pub fn prefill_graph(&self) -> Option<usize> {
        self.prefill.as_ref().map(|p| p.min_tokens)
    }

    /// Exchange the session, binding and output tensors with the prefill graph's (a second call swaps back).
    fn swap_prefill(&mut self) {
        if let Some(p) = self.prefill.as_mut() {
            std::mem::swap(&mut self.session, &mut p.session);
            std::mem::swap(&mut self.binding, &mut p.binding);
            std::mem::swap(&mut self.logits, &mut p.logits);
            std::mem::swap(&mut self.logits_bound, &mut p.logits_bound);
            std::mem::swap(&mut self.argmax, &mut p.argmax);
            std::mem::swap(&mut self.argmax_bound, &mut p.argmax_bound);
        }
    }

    /// [`Self::run`] on the prefill graph when one is loaded and the pass has at least its `min_tokens` new tokens.
    /// The output tensors it wrote stay alive (in the prefill graph's fields) until its next pass.
    fn run_maybe_prefill(
        &mut self,
        tokens: &[u32],
        n_past: usize,
        n_logits: usize,
        ids_only: bool,
    ) -> Result<(usize, *const f32)> {
        let prefill = self
            .prefill
            .as_ref()
            .is_some_and(|p| tokens.len() >= p.min_tokens);
        if prefill {
            self.swap_prefill();
        }
        let result = self.run(tokens, n_past, n_logits, ids_only).map(|rows| {
            let data = if ids_only {
                std::ptr::null()
            } else {
                self.logits
                    .last()
                    .map_or(std::ptr::null(), |(_, t)| t.data_ptr().cast::<f32>())
            };
            (rows, data)
        });
        if prefill {
            self.swap_prefill();
        }
        result
    }

    /// Bind the logits output to a reused `[1, rows, vocab]` tensor; returns its index in `self.logits`.
    fn bind_logits(&mut self, rows: usize) -> Result<()> {
        // `MemoryPlan::logits` is host memory for every provider: the session's CPU allocator.
        let shape = [1, rows, self.io.vocab_size];
        bind_host_output(
            &mut self.binding,
            self.session.allocator(),
            &mut self.logits,
            &mut self.logits_bound,
            "logits",
            rows,
            shape,
        )
    }

    /// Copy the first `n_past` positions of an Optimum present `[1, H, n_cached, D]` into a new contiguous
    /// `[1, H, n_past, D]` tensor (rollback).
    fn slice_past(&self, value: &DynValue, n_past: usize) -> Result<DynTensor> {
        let ty = match value.dtype() {
            ValueType::Tensor { ty, .. } => *ty,
            other => {
                return Err(SpecError::Internal(format!(
                    "present is not a tensor: {other:?}"
                )))
            }
        };
        let (h, d, t) = (self.io.kv_heads, self.io.head_dim, self.n_cached);
        let elem = ty
            .byte_size(1)
            .ok_or_else(|| SpecError::Internal("KV element size unknown".into()))?;
        let mut out = DynTensor::new(self.session.allocator(), ty, [1, h, n_past, d])
            .map_err(|e| ort_err("allocating a rolled-back past", &e))?;
        let tensor = value
            .downcast_ref::<ort::value::DynTensorValueType>()
            .map_err(|e| ort_err("reading a present", &e))?;
        let src = tensor.data_ptr().cast::<u8>();
        let dst = out.data_ptr_mut().cast::<u8>();
        let (row_src, row_dst) = (t * d * elem, n_past * d * elem);
        for head in 0..h {
            // SAFETY: CPU tensors; `src` holds h * t * d elements, `dst` h * n_past * d, n_past <= t.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.add(head * row_src),
                    dst.add(head * row_dst),
                    row_dst,
                )
            };
        }
        Ok(out)
    }

    fn bind_optimum_pasts(&mut self, n_past: usize) -> Result<()> {
        let n_cached = self.n_cached;
        let rolled: Option<Vec<DynTensor>> = match &self.kv {
            KvState::Optimum { pasts, .. } if n_past > 0 && n_past < n_cached => Some(
                pasts
                    .iter()
                    .map(|p| {
                        self.slice_past(p.as_ref().expect("n_cached > 0 means pasts exist"), n_past)
                    })
                    .collect::<Result<_>>()?,
            ),
            _ => None,
        };
        // Where ONNX Runtime allocates the presents (`MemoryInfo` is not `Send`, so it is made per call).
        let host = MemoryInfo::new(
            AllocationDevice::CPU,
            0,
            AllocatorType::Device,
            MemoryType::CPUOutput,
        )
        .map_err(|e| ort_err("creating CPU memory info", &e))?;
        let KvState::Optimum { pasts, empty } = &mut self.kv else {
            unreachable!("optimum layout")
        };
        if let Some(rolled) = rolled {
            for (slot, tensor) in pasts.iter_mut().zip(rolled) {
                *slot = Some(tensor.into_dyn());
            }
        }
        for layer in 0..self.io.n_layers {
            for (k, kind) in ["key", "value"].into_iter().enumerate() {
                let j = 2 * layer + k;
                let name = past_name(layer, kind);
                let result = if n_past == 0 {
                    self.binding.bind_input(name, &empty[j])
                } else {
                    self.binding.bind_input(
                        name,
                        pasts[j].as_ref().expect("n_past > 0 means pasts exist"),
                    )
                };
                result.map_err(|e| ort_err("binding a past KV input", &e))?;
                // Rebind every call: after a run ONNX Runtime keeps the allocated present as a preallocated output
                // of that (old) shape.
                self.binding
                    .bind_output_to_device(present_name(layer, kind), &host)
                    .map_err(|e| ort_err("binding a present KV output", &e))?;
            }
        }
        Ok(())
    }

    /// Bind the `argmax` output to a reused host tensor `[1, rows]` int64.
    fn bind_argmax(&mut self, rows: usize) -> Result<()> {
        bind_host_output(
            &mut self.binding,
            self.session.allocator(),
            &mut self.argmax,
            &mut self.argmax_bound,
            "argmax",
            rows,
            [1, rows],
        )
    }

    /// Run a decode step from its CUDA graph (every step shape's was created at load). Returns the logits rows.
    fn run_graph(
        &mut self,
        tokens: &[u32],
        n_past: usize,
        n_logits: usize,
        ids: bool,
    ) -> Result<usize> {
        let kv = self.kv_buffer_addresses();
        let kv_shape = [1, self.io.kv_heads, self.max_seq_len, self.io.head_dim];
        let id = graph_id(tokens.len(), n_logits);
        let Some(g) = self.graphs.as_mut() else {
            return Err(SpecError::Internal("graph steps are off".into()));
        };
        let step = g.steps[id].as_mut().ok_or_else(|| {
            SpecError::Internal(format!(
                "no graph step for {} tokens and {n_logits} logits rows",
                tokens.len()
            ))
        })?;
        // The cache rows past n_past are rewritten by this call.
        self.n_cached = n_past;
        step.run(
            &self.session,
            tokens,
            n_past,
            ids,
            &mut g.ledger,
            &g.copier,
            (&kv, &kv_shape),
        )?;
        g.last = Some(step.id());
        self.n_cached = n_past + tokens.len();
        Ok(step.rows())
    }

    /// How the graph steps copy their inputs and outputs (`"cudaMemcpy"`, `"onnxruntime"` or `"host"` in the CPU
    /// mode), or `None` without graph steps. For reports and tests.
    pub fn graph_copies(&self) -> Option<&'static str> {
        self.graphs.as_ref().map(|g| g.copier.name())
    }

    /// Leave output `name` to ONNX Runtime's allocator on the provider's device (it is not read this call), so
    /// nothing is copied to the host: `logits` of an argmax-only call, `argmax` of a logits call. ONNX Runtime keeps
    /// the output its run allocates bound at that run's shape: `bound` records the row count, and a call with
    /// another row count binds afresh (the same row count reuses the allocation).
    fn bind_unread(&mut self, name: &str, rows: usize) -> Result<()> {
        let bound = if name == "logits" {
            &mut self.logits_bound
        } else {
            &mut self.argmax_bound
        };
        if *bound == Bound::Device(rows) {
            return Ok(());
        }
        *bound = Bound::Device(rows);
        let memory = match self.provider {
            Provider::Cuda => MemoryInfo::new(
                AllocationDevice::CUDA,
                self.device_id,
                AllocatorType::Device,
                MemoryType::Default,
            ),
            Provider::Cpu => MemoryInfo::new(
                AllocationDevice::CPU,
                0,
                AllocatorType::Device,
                MemoryType::CPUOutput,
            ),
        }
        .map_err(|e| ort_err("creating the output memory info", &e))?;
        self.binding
            .bind_output_to_device(name, &memory)
            .map_err(|e| ort_err(&format!("binding {name} to the device"), &e))
    }

    /// One run. `ids`: the caller reads only the `argmax` output (bound to host memory; the logits stay on the
    /// device); otherwise the logits (bound to host memory). Returns the number of logits rows the graph made.
    fn run(
        &mut self,
        tokens: &[u32],
        n_past: usize,
        n_logits: usize,
        ids_only: bool,
    ) -> Result<usize> {
        let s = tokens.len();
        if let Some(g) = self.graphs.as_mut() {
            g.last = None;
            if is_graph_shape(s, n_logits) {
                return self.run_graph(tokens, n_past, n_logits, ids_only);
            }
        }
        for (dst, &t) in self.ids.iter_mut().zip(tokens) {
            *dst = i64::from(t);
        }
        let ids = TensorRef::from_array_view(([1, s], &self.ids[..s]))
            .map_err(|e| ort_err("input_ids", &e))?;
        self.binding
            .bind_input("input_ids", &ids)
            .map_err(|e| ort_err("binding input_ids", &e))?;
        if self.io.has_attention_mask {
            let total = n_past + s;
            let mask = TensorRef::from_array_view(([1, total], &self.ones[..total]))
                .map_err(|e| ort_err("attention_mask", &e))?;
            self.binding
                .bind_input("attention_mask", &mask)
                .map_err(|e| ort_err("binding attention_mask", &e))?;
        }
        if self.io.has_sequence_inputs {
            // GroupQueryAttention's sequence lengths, which the default form derives from attention_mask.
            let total = n_past + s;
            self.seq[0] =
                i32::try_from(total - 1).expect("max_seq_len fits in i32 (checked at load)");
            self.seq[1] = i32::try_from(total).expect("max_seq_len fits in i32 (checked at load)");
            let seqlens = TensorRef::from_array_view(([1usize], &self.seq[..1]))
                .map_err(|e| ort_err("seqlens_k", &e))?;
            self.binding
                .bind_input("seqlens_k", &seqlens)
                .map_err(|e| ort_err("binding seqlens_k", &e))?;
            let total = TensorRef::from_array_view((Vec::<i64>::new(), &self.seq[1..]))
                .map_err(|e| ort_err("total_sequence_length", &e))?;
            self.binding
                .bind_input("total_sequence_length", &total)
                .map_err(|e| ort_err("binding total_sequence_length", &e))?;
        }
        if self.io.has_position_ids {
            let pos = TensorRef::from_array_view(([1, s], &self.positions[n_past..n_past + s]))
                .map_err(|e| ort_err("position_ids", &e))?;
            self.binding
                .bind_input("position_ids", &pos)
                .map_err(|e| ort_err("binding position_ids", &e))?;
        }
        let rows = if self.io.has_num_logits_to_keep {
            self.n_keep[0] = i64::try_from(n_logits).expect("n_logits <= max_seq_len");
            let keep = TensorRef::from_array_view((Vec::<i64>::new(), &self.n_keep[..]))
                .map_err(|e| ort_err("num_logits_to_keep", &e))?;
            self.binding
                .bind_input("num_logits_to_keep", &keep)
                .map_err(|e| ort_err("binding num_logits_to_keep", &e))?;
            n_logits
        } else if self.io.has_logits_index {
            // The last n_logits of the s positions.
            let index = TensorRef::from_array_view(([n_logits], &self.positions[s - n_logits..s]))
                .map_err(|e| ort_err("logits_index", &e))?;
            self.binding
                .bind_input("logits_index", &index)
                .map_err(|e| ort_err("binding logits_index", &e))?;
            n_logits
        } else {
            s
        };
        if self.io.layout == KvLayout::Optimum {
            self.bind_optimum_pasts(n_past)?;
        }
        if ids_only {
            self.bind_argmax(rows)?;
            self.bind_unread("logits", rows)?;
        } else {
            self.bind_logits(rows)?;
            if self.io.has_argmax {
                self.bind_unread("argmax", rows)?;
            }
        }
        if self.provider == Provider::Cuda {
            // Host inputs are copied to the device when bound; make sure those copies are done.
            self.binding
                .synchronize_inputs()
                .map_err(|e| ort_err("synchronizing inputs", &e))?;
        }

        // From here on only the first n_past positions are known good (the pasts may have been sliced to n_past;
        // a failed run may have written rows past it): keep the bookkeeping right if the run fails.
        self.n_cached = n_past;
        if let KvState::Optimum { pasts, .. } = &mut self.kv {
            let mut outputs = self
                .session
                .run_binding(&self.binding)
                .map_err(|e| ort_err("running the model", &e))?;
            for layer in 0..self.io.n_layers {
                for (k, kind) in ["key", "value"].into_iter().enumerate() {
                    let name = present_name(layer, kind);
                    let value = outputs.remove(&name).ok_or_else(|| {
                        SpecError::Internal(format!("output {name} missing after the run"))
                    })?;
                    pasts[2 * layer + k] = Some(value);
                }
            }
        } else {
            // Every output is preallocated and read from our own tensors: call RunWithBinding directly and skip
            // `run_binding`'s GetBoundOutputValues (a new OrtValue wrapper + type query per output, per call).
            // SAFETY: valid session and binding pointers (the binding was created from this session); a null
            // run-options pointer is allowed. ort's `run_binding` makes the same call.
            let run_options = self
                .graphs
                .as_ref()
                .and_then(|g| g.no_graph.as_ref())
                .map_or(std::ptr::null(), |o| o.ptr());
            let status = unsafe {
                (ort::api().RunWithBinding)(
                    self.session.ptr().cast_mut(),
                    run_options,
                    self.binding.ptr(),
                )
            };
            // SAFETY: `status` was just returned by ONNX Runtime.
            unsafe { ort::Error::result_from_status(status) }
                .map_err(|e| ort_err("running the model", &e))?;
        }
        if self.provider == Provider::Cuda {
            self.binding
                .synchronize_outputs()
                .map_err(|e| ort_err("synchronizing outputs", &e))?;
        }
        self.n_cached = n_past + s;
        Ok(rows)
    }
}

impl Backend for OrtBackend {
    /// The full vocabulary (a pruned-vocabulary model included: its rows are `-inf` outside its subset).
    fn vocab_size(&self) -> usize {
        self.subset
            .as_ref()
            .map_or(self.io.vocab_size, VocabSubset::full_vocab)
    }

    fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// See [`Backend::forward`]. Also [`SpecError::Vocab`] for a token id `>= vocab_size`, and
    /// [`SpecError::Config`] for an `n_past` beyond the positions cached by previous calls.
    fn forward(&mut self, tokens: &[u32], n_past: usize, n_logits: usize) -> Result<&[f32]> {
        self.validate(tokens, n_past, n_logits)?;
        let (rows, data) = self.run_maybe_prefill(tokens, n_past, n_logits, false)?;
        let vocab = self.io.vocab_size;
        let all = match self.graphs.as_ref().and_then(|g| g.last.map(|s| (g, s))) {
            Some((g, id)) => g.steps[id].as_ref().expect("ran").logits(vocab),
            None => {
                assert!(!data.is_null(), "logits bound in run");
                // SAFETY: `data` is the logits tensor the run wrote (the model's or the prefill graph's, bound in
                // `run`): `rows * vocab` f32 in host memory (the session's CPU allocator; on CUDA the outputs were
                // synchronised in `run`), owned by `self` until the next call.
                unsafe { std::slice::from_raw_parts(data, rows * vocab) }
            }
        };
        let kept = &all[(rows - n_logits) * vocab..];
        match self.subset.as_mut() {
            Some(subset) => subset.expand(kept, n_logits),
            None => Ok(kept),
        }
    }

    /// See [`Backend::forward_argmax`]. On the CUDA provider (or with [`OrtOptions::device_argmax`]) a model with
    /// an `argmax` output (the graph form) computes the ids in the graph, on the device, and only `[n_logits]` int64
    /// reach the host (its logits are not checked for NaN); otherwise the default (logits to the host, checked,
    /// scanned).
    fn forward_argmax(
        &mut self,
        tokens: &[u32],
        n_past: usize,
        n_logits: usize,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        if !self.use_argmax_output {
            return specrt_core::backend::argmax_of_forward(self, tokens, n_past, n_logits, out);
        }
        self.validate(tokens, n_past, n_logits)?;
        let rows = self.run(tokens, n_past, n_logits, true)?;
        debug_assert_eq!(rows, n_logits);
        let ids = match self.graphs.as_ref().and_then(|g| g.last.map(|s| (g, s))) {
            Some((g, id)) => g.steps[id].as_ref().expect("ran").argmax(),
            None => {
                let (_, tensor) = self.argmax.last().expect("bound in run");
                // SAFETY: the tensor holds `rows` i64 in host memory (the session's CPU allocator; on CUDA the
                // outputs were synchronised in `run`) and lives in `self`.
                unsafe { std::slice::from_raw_parts(tensor.data_ptr().cast::<i64>(), rows) }
            }
        };
        let width = self.io.vocab_size;
        out.clear();
        for &i in ids {
            let i = usize::try_from(i)
                .ok()
                .filter(|&i| i < width)
                .ok_or_else(|| {
                    SpecError::Internal(format!(
                        "argmax output {i} is outside the logits width {width}"
                    ))
                })?;
            #[allow(clippy::cast_possible_truncation)]
            out.push(match &self.subset {
                Some(subset) => subset.ids()[i],
                None => i as u32,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
impl OrtBackend {
    /// Replace the graph step of `(s, rows)` by a freshly allocated one, as a step created lazily after a capture
    /// would be (tests of the replay checks only).
    fn recreate_graph_step(&mut self, s: usize, rows: usize) -> Result<()> {
        let (Some(g), KvState::Shared { buffers }) = (self.graphs.as_mut(), &mut self.kv) else {
            return Err(SpecError::Internal("no graph steps".into()));
        };
        let step = GraphStep::new(
            &self.session,
            self.session.allocator(),
            buffers,
            (s, rows),
            self.io.vocab_size,
            self.max_seq_len,
            false,
            &mut g.ledger,
            &g.copier,
        )?;
        g.steps[graph_id(s, rows)] = Some(step);
        Ok(())
    }
}

#[cfg(test)]
mod graph_step_tests {
    //! The replay checks on the real graph steps, in the CPU mode (`make test-rs` sets the paths).
    use super::*;

    fn graph_backend() -> Option<OrtBackend> {
        let lib = std::env::var_os("SPECRT_ORT_LIBRARY")?;
        let model = std::env::var_os("SPECRT_TEST_GRAPH_MODEL")?;
        let mut options = OrtOptions::new(PathBuf::from(lib));
        options.max_seq_len = Some(64);
        options.cpu_graph_steps = true;
        Some(OrtBackend::new(PathBuf::from(model), &options).expect("graph-form test model"))
    }

    #[test]
    fn a_step_allocated_after_a_capture_is_caught_before_it_runs() {
        let Some(mut b) = graph_backend() else { return };
        assert_eq!(b.graph_copies(), Some("host"));
        let mut ids = Vec::new();
        b.forward_argmax(
            &[
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
            ],
            0,
            1,
            &mut ids,
        )
        .unwrap(); // a prefill: no graph
        b.forward_argmax(&[3], 20, 1, &mut ids).unwrap(); // graph 1 captured
        b.forward_argmax(&[4, 5, 6, 7], 21, 4, &mut ids).unwrap(); // graph 4 captured
        b.forward(&[8], 25, 1).unwrap(); // graph 1 replayed
                                         // A step created lazily: the 3-token step allocated after graphs were captured.
        b.recreate_graph_step(3, 3).unwrap();
        let err = b.forward_argmax(&[8, 9, 10], 26, 3, &mut ids).unwrap_err();
        assert!(
            err.to_string()
                .contains("logits_index was allocated after a graph was captured"),
            "{err}"
        );
        // A captured step whose tensors were reallocated.
        b.recreate_graph_step(4, 4).unwrap();
        let err = b.forward(&[8, 9, 10, 11], 26, 4).unwrap_err();
        assert!(err.to_string().contains("CUDA graph 4"), "{err}");
        // The untouched steps still run.
        b.forward_argmax(&[8], 26, 1, &mut ids).unwrap();
        b.forward_argmax(&[9, 10], 27, 1, &mut ids).unwrap(); // the catch-up shape
    }
}
