//! Plain-Rust options of the ONNX Runtime backend (no ort types), with parsing and validation.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use specrt_core::{Result, SpecError};

/// Sequence length used when neither the options nor the model folder give one.
pub const DEFAULT_MAX_SEQ_LEN: usize = 4096;

/// Execution provider of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Provider {
    /// ONNX Runtime's CPU execution provider.
    #[default]
    Cpu,
    /// ONNX Runtime's CUDA execution provider (needs the `onnxruntime-gpu` wheel, a CUDA driver and cuDNN).
    Cuda,
}

impl Provider {
    /// The name used on the Python side and in option strings: `"cpu"` or `"cuda"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Cpu => "cpu",
            Provider::Cuda => "cuda",
        }
    }

    /// ONNX Runtime's name of the execution provider (`"CPUExecutionProvider"`, `"CUDAExecutionProvider"`).
    pub fn ort_name(self) -> &'static str {
        match self {
            Provider::Cpu => "CPUExecutionProvider",
            Provider::Cuda => "CUDAExecutionProvider",
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Provider {
    type Err = SpecError;

    /// Parse `"cpu"` / `"cuda"` (case-insensitive; ORT names like `"CUDAExecutionProvider"` are accepted too).
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" | "cpuexecutionprovider" => Ok(Provider::Cpu),
            "cuda" | "gpu" | "cudaexecutionprovider" => Ok(Provider::Cuda),
            _ => Err(SpecError::setting(
                "provider",
                format!("provider '{s}' is invalid (expected one of: 'cpu', 'cuda')"),
            )),
        }
    }
}

/// How the model's KV cache inputs and outputs relate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayout {
    /// The specrt decoder contract (onnxruntime-genai style): `past_key_values.{i}.*` and `present.{i}.*` are one
    /// preallocated `[1, kv_heads, max_seq, head_dim]` buffer; the graph appends at `n_past` (GroupQueryAttention).
    SharedBuffer,
    /// Hugging Face Optimum: `past_key_values.{i}.*` is `[1, kv_heads, past, head_dim]`, `present.{i}.*` is the
    /// concatenation `[1, kv_heads, past + S, head_dim]` and becomes the next past.
    Optimum,
    /// The batched decoder contract (`specrt convert --attention batched`, ARCHITECTURE.md "Batched rounds"): rows of
    /// a batch on their own caches, `past_key_values.{i}.key_t` `[B, kv_heads, head_dim, max_seq]` (keys transposed)
    /// and `past_key_values.{i}.value` `[B, kv_heads, max_seq, head_dim]`, read in place; the pass's new keys and
    /// values come out as `new.{i}.key` / `new.{i}.value` for the runtime to write. Run by
    /// [`crate::BatchedOrtBackend`] only ([`crate::OrtBackend`] refuses it).
    BatchedRows,
}

impl KvLayout {
    /// `"shared_buffer"`, `"optimum"` or `"batched_rows"` (the `kv_layout` value of `specrt_config.json`).
    pub fn as_str(self) -> &'static str {
        match self {
            KvLayout::SharedBuffer => "shared_buffer",
            KvLayout::Optimum => "optimum",
            KvLayout::BatchedRows => "batched_rows",
        }
    }
}

impl fmt::Display for KvLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for KvLayout {
    type Err = SpecError;

    /// Parse `"shared_buffer"` / `"optimum"` / `"batched_rows"` (also `"concat"` for Optimum, `"batched"` for
    /// batched rows).
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "shared_buffer" | "shared" => Ok(KvLayout::SharedBuffer),
            "optimum" | "concat" => Ok(KvLayout::Optimum),
            "batched_rows" | "batched" => Ok(KvLayout::BatchedRows),
            _ => Err(SpecError::Config(format!(
                "kv layout {s:?} is invalid (expected one of: \"shared_buffer\", \"optimum\", \"batched_rows\")"
            ))),
        }
    }
}

/// Where a tensor that the backend binds lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Plain host memory from the session's CPU allocator (readable from Rust as a slice).
    Host,
    /// Page-locked host memory from the CUDA provider's pinned allocator.
    CudaPinned,
    /// Device memory from the CUDA provider's allocator (not host-readable).
    CudaDevice,
}

impl Memory {
    /// `"host"`, `"cuda_pinned"` or `"cuda_device"` (diagnostics).
    pub fn as_str(self) -> &'static str {
        match self {
            Memory::Host => "host",
            Memory::CudaPinned => "cuda_pinned",
            Memory::CudaDevice => "cuda_device",
        }
    }
}

/// The memory of every tensor an [`crate::OrtBackend`] binds, per provider: the one place these choices are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The preallocated `[1, kv_heads, max_seq_len, head_dim]` past/present buffers (shared-buffer layout).
    pub kv_cache: Memory,
    /// The reused `[1, rows, vocab]` float32 logits outputs.
    pub logits: Memory,
    /// `input_ids`, `attention_mask`, `position_ids`, `num_logits_to_keep` (borrowed host views, copied to the
    /// device by ONNX Runtime when bound).
    pub inputs: Memory,
}

impl MemoryPlan {
    /// The plan for `provider`.
    ///
    /// CUDA: the KV cache stays on the device for the whole session; logits are written by ONNX Runtime into plain
    /// host memory. Never [`Memory::CudaPinned`] for an output: onnxruntime-gpu 1.31 (CUDA 13) refuses the
    /// host-to-host self-copy it then attempts (`GPUDataTransfer::CopyTensorAsync ... dst_data != src_data`,
    /// onnxruntime issue #29713).
    pub fn for_provider(provider: Provider) -> Self {
        match provider {
            Provider::Cpu => MemoryPlan {
                kv_cache: Memory::Host,
                logits: Memory::Host,
                inputs: Memory::Host,
            },
            Provider::Cuda => MemoryPlan {
                kv_cache: Memory::CudaDevice,
                logits: Memory::Host,
                inputs: Memory::Host,
            },
        }
    }
}

/// The attention layout a decoder's models are converted in (`specrt convert --attention`), decided by its
/// options ([`DecoderOptions::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attention {
    /// One sequence in a shared KV buffer, GroupQueryAttention (single-stream decoding).
    Gqa,
    /// [`Attention::Gqa`] in the form CUDA graphs can replay (`cuda_graph`).
    GqaGraph,
    /// Rows of a batch on per-row caches (`max_batch` > 1).
    Batched,
}

impl Attention {
    /// The name `specrt convert --attention` and the model cache use: `"gqa"`, `"gqa-graph"`, `"batched"`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Attention::Gqa => "gqa",
            Attention::GqaGraph => "gqa-graph",
            Attention::Batched => "batched",
        }
    }
}

/// A decoder's own options (Python's `Decoder(...)`, `specrt serve`'s flags), checked before any model is pulled
/// or loaded. The one definition of their ranges and of how they combine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecoderOptions {
    /// Execution provider.
    pub provider: Provider,
    /// CUDA device ordinal.
    pub device_id: i64,
    /// Longest prompt + new tokens (`None` = the model's whole `max_position_embeddings`).
    pub max_seq_len: Option<i64>,
    /// ONNX Runtime intra-op threads (`None` = the physical cores).
    pub intra_op_threads: Option<i64>,
    /// CUDA graphs of the decode steps ([`OrtOptions::cuda_graph`]).
    pub cuda_graph: bool,
    /// Rows decoded together (1 = single-stream).
    pub max_batch: i64,
    /// Most prompt tokens a joining request prefills per pass (batched).
    pub prefill_chunk: i64,
    /// Most prompt tokens prefilled per round over all joining requests (batched;
    /// [`specrt_core::BatchOptions::max_prefill_tokens`]; `None` = [`specrt_core::DEFAULT_MAX_PREFILL_TOKENS`]).
    pub max_prefill_tokens: Option<i64>,
    /// Tokens of earlier requests' prompts and outputs that suffix decoding shares among the decoder's requests
    /// (0 = none: each request drafts from its own text; [`specrt_core::SuffixCache`]).
    pub suffix_cache_tokens: i64,
}

impl DecoderOptions {
    /// `prefill_chunk`'s allowed values.
    pub const PREFILL_CHUNK: &'static str = "an integer >= 1";
    /// `max_seq_len`'s allowed values.
    pub const MAX_SEQ_LEN: &'static str = "an integer >= 1, or None for the model's maximum";
    /// `intra_op_threads`' allowed values.
    pub const INTRA_OP_THREADS: &'static str = "an integer >= 1, or None for the cores";
    /// `device_id`'s allowed values.
    pub const DEVICE_ID: &'static str = "an integer >= 0";

    /// Check the options and say which attention layout the models need: [`Attention::Batched`] for `max_batch`
    /// > 1, [`Attention::GqaGraph`] with `cuda_graph`, else [`Attention::Gqa`].
    ///
    /// Errors: [`SpecError::Setting`] naming the option and its allowed values: a count out of range, `cuda_graph`
    /// without the CUDA provider, or with `max_batch` > 1 (CUDA graphs replay single-stream decode steps).
    pub fn check(&self) -> Result<Attention> {
        let bad = |name: &str, value: i64, expected: &str| {
            Err(SpecError::setting(
                name,
                format!("{name} {value} is invalid (expected {expected})"),
            ))
        };
        if let Some(n) = self.intra_op_threads.filter(|&n| n < 1) {
            return bad("intra_op_threads", n, Self::INTRA_OP_THREADS);
        }
        if let Some(n) = self.max_seq_len.filter(|&n| n < 1) {
            return bad("max_seq_len", n, Self::MAX_SEQ_LEN);
        }
        if self.device_id < 0 || self.device_id > i64::from(i32::MAX) {
            return bad("device_id", self.device_id, Self::DEVICE_ID);
        }
        crate::batched::check_max_batch(self.max_batch)?;
        if self.prefill_chunk < 1 {
            return bad("prefill_chunk", self.prefill_chunk, Self::PREFILL_CHUNK);
        }
        if let Some(n) = self.max_prefill_tokens.filter(|&n| n < 1) {
            return bad(
                "max_prefill_tokens",
                n,
                specrt_core::BatchOptions::MAX_PREFILL_TOKENS,
            );
        }
        specrt_core::check_suffix_cache_tokens(self.suffix_cache_tokens)?;
        if self.cuda_graph && self.provider != Provider::Cuda {
            return Err(cuda_graph_needs_cuda(self.provider));
        }
        if self.cuda_graph && self.max_batch > 1 {
            return Err(SpecError::setting(
                "cuda_graph",
                format!(
                    "cuda_graph runs single-stream decoding (max_batch 1), got max_batch {}",
                    self.max_batch
                ),
            ));
        }
        Ok(if self.max_batch > 1 {
            Attention::Batched
        } else if self.cuda_graph {
            Attention::GqaGraph
        } else {
            Attention::Gqa
        })
    }
}

/// The error of `cuda_graph` on another provider than CUDA.
fn cuda_graph_needs_cuda(provider: Provider) -> SpecError {
    SpecError::setting(
        "cuda_graph",
        format!(
            "cuda_graph needs provider 'cuda' (got provider '{provider}'): CUDA graphs replay GPU kernels"
        ),
    )
}

/// Options of one [`crate::OrtBackend`] (one model, one session).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrtOptions {
    /// Absolute path of `libonnxruntime.so.1.x` (from the `onnxruntime` / `onnxruntime-gpu` wheel). Loaded once per
    /// process; every backend of the process must name the same file.
    pub ort_library: PathBuf,
    /// Execution provider (default CPU).
    pub provider: Provider,
    /// CUDA device ordinal (ignored on CPU).
    pub device_id: i32,
    /// Intra-op threads; `None` = the number of physical cores.
    pub intra_op_threads: Option<usize>,
    /// Inter-op threads (the session runs sequentially, so 1 is right).
    pub inter_op_threads: usize,
    /// Longest total sequence (cached + new tokens); bounds the KV memory each model preallocates. Default
    /// (`OrtOptions::new`, Python's `Decoder`, `specrt serve`): `Some(`[`DEFAULT_MAX_SEQ_LEN`]`)`. `None` =
    /// `max_position_embeddings` from `specrt_config.json`, else [`DEFAULT_MAX_SEQ_LEN`]; always capped by the
    /// model's maximum when known.
    pub max_seq_len: Option<usize>,
    /// When CUDA is requested but cannot be used, fall back to CPU (reported by
    /// [`crate::OrtBackend::fallback_reason`]) instead of failing with [`SpecError::Provider`].
    pub allow_fallback: bool,
    /// Force a KV layout instead of detecting it (see [`crate::OrtBackend::layout`]).
    pub layout: Option<KvLayout>,
    /// CUDA graphs (default false): capture the decode steps (1 to [`crate::MAX_GRAPH_TOKENS`] new tokens, logits of
    /// all of them) into CUDA graphs and replay them (`crate::cuda_graph`). Needs the CUDA provider and a model in
    /// the graph form (`specrt convert --attention gqa-graph`).
    pub cuda_graph: bool,
    /// The CPU mode of the CUDA-graph steps (default false): on the CPU provider, run a graph-form model's decode
    /// steps through the same fixed-address step bindings as `cuda_graph`, with the replay invariants checked before
    /// every step (`crate::cuda_graph`); nothing is captured. For tests and diagnostics: what CUDA graphs rely on,
    /// checked without a GPU. Needs the CPU provider and a model in the graph form.
    pub cpu_graph_steps: bool,
    /// ONNX Runtime's profiler (default off): write a Chrome-trace JSON of every run (a `model_run` event per run,
    /// a `Node` event per kernel) to a file named from this prefix (ONNX Runtime appends a timestamp); the file is
    /// complete after [`crate::OrtBackend::end_profiling`]. The process's sessions share one thread pool, whose own
    /// profiler starts and ends with this session's: a run of another session on another thread at that moment fails
    /// inside ONNX Runtime ("LogStart must pair with LogEnd"). Profile in a process that runs nothing else meanwhile
    /// (the draft and target of one engine run one after the other, which is fine).
    pub profile: Option<PathBuf>,
    /// Whether [`specrt_core::Backend::forward_argmax`] reads a graph-form model's `argmax` output: `None` (default)
    /// = on the CUDA provider only, where it saves copying the logits to the host; on the CPU the logits are in host
    /// memory anyway, and scanning them keeps the NaN / inf check. `Some(true)` = always (tests, profiles),
    /// `Some(false)` = never.
    pub device_argmax: Option<bool>,
    /// Run passes of many new tokens (a prompt's prefill, a draft's catch-up; in a batched pass, the longest row's
    /// count decides) on the model's prefill graph when its folder has one (`specrt convert --prefill-graph`: the same decoder with int8 matrices on ONNX Runtime's
    /// integer GEMM, 2x faster than the int4 kernel on hundreds of tokens on a CPU). Default false; the engines set
    /// it for draft models only: the prefill graph computes slightly different keys and values, which changes a
    /// draft's proposals but never the output (verification is the target's), and would change a target's output.
    pub prefill_graph: bool,
}

impl OrtOptions {
    /// The options a draft model loads with: these, with [`OrtOptions::prefill_graph`] on (a draft runs its long
    /// passes on its folder's prefill graph when it has one; the output stays the target's). Every engine
    /// (`Pipeline`, Python's `Engine` and `BatchEngine`) loads its draft with them.
    #[must_use]
    pub fn for_draft(&self) -> OrtOptions {
        OrtOptions {
            prefill_graph: true,
            ..self.clone()
        }
    }

    /// CPU defaults for the library at `ort_library`.
    pub fn new(ort_library: impl Into<PathBuf>) -> Self {
        OrtOptions {
            ort_library: ort_library.into(),
            provider: Provider::Cpu,
            device_id: 0,
            intra_op_threads: None,
            inter_op_threads: 1,
            max_seq_len: Some(DEFAULT_MAX_SEQ_LEN),
            allow_fallback: false,
            layout: None,
            cuda_graph: false,
            cpu_graph_steps: false,
            profile: None,
            device_argmax: None,
            prefill_graph: false,
        }
    }

    /// Check the values that need no library or model.
    ///
    /// Errors: [`SpecError::Setting`] naming the option: a relative or empty library path (`ort_library`), zero
    /// threads, a zero `max_seq_len`, an empty profile prefix, `cuda_graph` / `cpu_graph_steps` with another provider,
    /// a negative device id; [`SpecError::NotFound`] for a profile prefix in a folder that does not exist.
    pub fn validate(&self) -> Result<()> {
        if self.ort_library.as_os_str().is_empty() {
            return Err(SpecError::setting(
                "ort_library",
                "ort_library is empty (expected the absolute path of libonnxruntime.so.1.x)",
            ));
        }
        if !self.ort_library.is_absolute() {
            return Err(SpecError::setting(
                "ort_library",
                format!(
                    "ort_library {:?} is not an absolute path (a relative path would be resolved against the Python \
                     interpreter's directory)",
                    self.ort_library
                ),
            ));
        }
        if self.intra_op_threads == Some(0) {
            return Err(SpecError::setting(
                "intra_op_threads",
                "intra_op_threads 0 is invalid (expected >= 1)",
            ));
        }
        if self.inter_op_threads == 0 {
            return Err(SpecError::setting(
                "inter_op_threads",
                "inter_op_threads 0 is invalid (expected >= 1)",
            ));
        }
        if self.max_seq_len == Some(0) {
            return Err(SpecError::setting(
                "max_seq_len",
                "max_seq_len 0 is invalid (expected >= 1)",
            ));
        }
        if let Some(prefix) = &self.profile {
            if prefix.as_os_str().is_empty() {
                return Err(SpecError::setting(
                    "profile",
                    "profile prefix is empty (expected a file name prefix such as /tmp/specrt-trace)",
                ));
            }
            if let Some(dir) = prefix.parent().filter(|d| !d.as_os_str().is_empty()) {
                if !dir.is_dir() {
                    return Err(SpecError::NotFound(format!(
                        "profile directory {} does not exist (the trace of profile prefix {} goes there)",
                        dir.display(),
                        prefix.display()
                    )));
                }
            }
        }
        if self.cuda_graph && self.provider != Provider::Cuda {
            return Err(cuda_graph_needs_cuda(self.provider));
        }
        if self.cpu_graph_steps && self.provider != Provider::Cpu {
            return Err(SpecError::setting(
                "cpu_graph_steps",
                format!(
                    "cpu_graph_steps needs provider 'cpu' (got provider '{}'; on CUDA use cuda_graph)",
                    self.provider
                ),
            ));
        }
        if self.device_id < 0 {
            return Err(SpecError::setting(
                "device_id",
                format!("device_id {} is invalid (expected >= 0)", self.device_id),
            ));
        }
        Ok(())
    }

    /// Intra-op threads to use: the option, or [`physical_cores`].
    pub fn effective_intra_op_threads(&self) -> usize {
        self.intra_op_threads.unwrap_or_else(physical_cores)
    }
}

/// Number of physical cores (distinct `(physical id, core id)` pairs in `/proc/cpuinfo`), falling back to the
/// available parallelism (logical CPUs), and never above it (cgroup/affinity limits).
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let physical = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .map(|text| count_physical_cores(&text))
        .unwrap_or(0);
    if physical == 0 {
        logical
    } else {
        physical.min(logical)
    }
}

/// Count distinct `(physical id, core id)` pairs in `/proc/cpuinfo` text; 0 if the fields are absent.
fn count_physical_cores(cpuinfo: &str) -> usize {
    let mut seen = std::collections::BTreeSet::new();
    for block in cpuinfo.split("\n\n") {
        let field = |key: &str| {
            block.lines().find_map(|line| {
                let (k, v) = line.split_once(':')?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
        };
        if let Some(core) = field("core id") {
            seen.insert((field("physical id").unwrap_or_default(), core));
        }
    }
    seen.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_plan_keeps_the_cache_on_the_device_and_never_binds_outputs_to_pinned_memory() {
        // Regression test for onnxruntime#29713: logits bound to CUDA-pinned memory failed every CUDA run.
        let cuda = MemoryPlan::for_provider(Provider::Cuda);
        assert_eq!(cuda.kv_cache, Memory::CudaDevice);
        assert_eq!(cuda.logits, Memory::Host);
        for plan in [cuda, MemoryPlan::for_provider(Provider::Cpu)] {
            assert_ne!(plan.logits, Memory::CudaPinned);
            assert_ne!(plan.kv_cache, Memory::CudaPinned);
        }
        assert_eq!(
            MemoryPlan::for_provider(Provider::Cpu).kv_cache,
            Memory::Host
        );
    }

    #[test]
    fn provider_parses_names_case_insensitively() {
        assert_eq!("cpu".parse::<Provider>().unwrap(), Provider::Cpu);
        assert_eq!(" CUDA ".parse::<Provider>().unwrap(), Provider::Cuda);
        assert_eq!(
            "CUDAExecutionProvider".parse::<Provider>().unwrap(),
            Provider::Cuda
        );
        assert_eq!(Provider::Cuda.ort_name(), "CUDAExecutionProvider");
        assert_eq!(Provider::default(), Provider::Cpu);
    }

    #[test]
    fn unknown_provider_names_the_valid_set() {
        let err = "tpu".parse::<Provider>().unwrap_err();
        let SpecError::Setting {
            field,
            message: msg,
        } = err
        else {
            panic!("expected Setting")
        };
        assert_eq!(field, "provider");
        assert!(
            msg.contains("provider 'tpu' is invalid (expected one of: 'cpu', 'cuda')"),
            "{msg}"
        );
    }

    #[test]
    fn layout_round_trips() {
        for layout in [
            KvLayout::SharedBuffer,
            KvLayout::Optimum,
            KvLayout::BatchedRows,
        ] {
            assert_eq!(layout.as_str().parse::<KvLayout>().unwrap(), layout);
        }
        assert!("paged".parse::<KvLayout>().is_err());
    }

    #[test]
    fn defaults_are_cpu_sequential() {
        let o = OrtOptions::new("/abs/libonnxruntime.so.1.32.0");
        assert_eq!(o.provider, Provider::Cpu);
        assert_eq!(o.inter_op_threads, 1);
        assert!(!o.allow_fallback);
        assert!(o.validate().is_ok());
        assert!(o.effective_intra_op_threads() >= 1);
    }

    #[test]
    fn validate_rejects_bad_values() {
        let base = OrtOptions::new("/abs/lib.so");
        let cases = [
            OrtOptions {
                ort_library: "".into(),
                ..base.clone()
            },
            OrtOptions {
                ort_library: "lib/libonnxruntime.so".into(),
                ..base.clone()
            },
            OrtOptions {
                intra_op_threads: Some(0),
                ..base.clone()
            },
            OrtOptions {
                inter_op_threads: 0,
                ..base.clone()
            },
            OrtOptions {
                max_seq_len: Some(0),
                ..base.clone()
            },
            OrtOptions {
                device_id: -1,
                ..base.clone()
            },
            OrtOptions {
                cuda_graph: true,
                ..base.clone()
            },
        ];
        for case in cases {
            assert!(
                matches!(case.validate(), Err(SpecError::Setting { .. })),
                "{case:?}"
            );
        }
    }

    #[test]
    fn physical_cores_counts_core_ids_not_hyperthreads() {
        let text = "processor\t: 0\nphysical id\t: 0\ncore id\t: 0\n\nprocessor\t: 1\nphysical id\t: 0\ncore id\t: 0\n\n\
                    processor\t: 2\nphysical id\t: 0\ncore id\t: 1\n\nprocessor\t: 3\nphysical id\t: 1\ncore id\t: 0\n";
        assert_eq!(count_physical_cores(text), 3);
        assert_eq!(count_physical_cores("processor : 0\n"), 0);
        assert!(physical_cores() >= 1);
    }

    #[test]
    fn decoder_options_give_the_layout_and_name_what_is_wrong() {
        let base = DecoderOptions {
            provider: Provider::Cpu,
            device_id: 0,
            max_seq_len: Some(4096),
            intra_op_threads: None,
            cuda_graph: false,
            max_batch: 1,
            prefill_chunk: 256,
            max_prefill_tokens: None,
            suffix_cache_tokens: 0,
        };
        assert_eq!(base.check().unwrap(), Attention::Gqa);
        let batched = DecoderOptions {
            max_batch: 4,
            ..base.clone()
        };
        assert_eq!(batched.check().unwrap(), Attention::Batched);
        let graph = DecoderOptions {
            provider: Provider::Cuda,
            cuda_graph: true,
            ..base.clone()
        };
        assert_eq!(graph.check().unwrap(), Attention::GqaGraph);
        let refused = [
            (
                DecoderOptions {
                    max_batch: 0,
                    ..base.clone()
                },
                "max_batch 0 is invalid (expected an integer 1 <= max_batch <= 64)",
            ),
            (
                DecoderOptions {
                    max_batch: 65,
                    ..base.clone()
                },
                "max_batch 65",
            ),
            (
                DecoderOptions {
                    prefill_chunk: 0,
                    ..base.clone()
                },
                "prefill_chunk 0 is invalid",
            ),
            (
                DecoderOptions {
                    max_prefill_tokens: Some(0),
                    ..base.clone()
                },
                "max_prefill_tokens 0 is invalid (expected an integer >= 1)",
            ),
            (
                DecoderOptions {
                    suffix_cache_tokens: -1,
                    ..base.clone()
                },
                "suffix_cache_tokens -1 is invalid (expected an integer 0 <= suffix_cache_tokens <= 67108864, 0 = no",
            ),
            (
                DecoderOptions {
                    max_seq_len: Some(-3),
                    ..base.clone()
                },
                "max_seq_len -3 is invalid",
            ),
            (
                DecoderOptions {
                    intra_op_threads: Some(0),
                    ..base.clone()
                },
                "intra_op_threads 0 is invalid",
            ),
            (
                DecoderOptions {
                    device_id: -1,
                    ..base.clone()
                },
                "device_id -1 is invalid",
            ),
            (
                DecoderOptions {
                    cuda_graph: true,
                    ..base.clone()
                },
                "cuda_graph needs provider 'cuda' (got provider 'cpu')",
            ),
            (
                DecoderOptions {
                    max_batch: 2,
                    ..graph.clone()
                },
                "cuda_graph runs single-stream decoding (max_batch 1), got max_batch 2",
            ),
        ];
        for (options, message) in refused {
            let err = options.check().unwrap_err();
            assert!(
                matches!(&err, SpecError::Setting { field, message: m }
                    if m.contains(message) && m.starts_with(field.as_str())),
                "{err}"
            );
        }
    }
}
