//! Latency of whole speculative rounds (draft passes + one target pass + verification + bookkeeping) at
//! K = 0, 1, 4, 8, on real ONNX models, from Rust alone (no Python in the loop), through the driver every generation
//! runs through (`Driver` over the single-stream engine).
//!
//! Models, first that applies:
//! 1. `$SPECRT_BENCH_TARGET` (and `$SPECRT_BENCH_DRAFT`; without it the target is its own draft);
//! 2. SmolLM2-135M fp32 and its 6-layer self-draft in the specrt cache (`$SPECRT_CACHE_DIR`, default
//!    `~/.cache/specrt`): `models/smollm2-135m-instruct/fp32` and `fp32-L6`, made by
//!    `specrt models pull smollm2-135m-instruct` and
//!    `python -c "from specrt import models; models.truncated('smollm2-135m-instruct', 6)"`;
//! 3. `$SPECRT_TEST_MODEL` (the tiny model of `make test-rs`) as its own draft.
//!
//! Without any, it prints how to get one and exits 0. The library comes from `find_ort_library(None)`.
//!
//! Each round is greedy (temperature 0) with a fixed K and the draft-model proposer, on a fixed ~40-token code
//! prompt (cut to a quarter of the KV length), `ignore_eos`, up to 192 new tokens per generation; a finished
//! generation is restarted outside the timed region (its first step, the prefill and a round, is never timed). criterion reports the time per
//! round; after it, one line per K splits the measured rounds with the engine's own timers (`Stats::draft_ms`,
//! `target_ms`, `core_ms`): ms/round total (wall), draft, target, verify+bookkeeping, and emitted tokens per round.
//! The KV caches hold 512 positions (the tiny model: its 256).
//!
//! `cargo bench -p specrt-ort --bench rounds` (criterion flags after `--`, e.g. `-- --measurement-time 20`).
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::Criterion;
use specrt_ort::specrt_core::{Stats, DEFAULT_PREFIX_CACHING};
use specrt_ort::{
    find_ort_library, Driver, GenerationRequest, OrtOptions, Proposer, SpeculativeTokens,
};

const KS: [usize; 4] = [0, 1, 4, 8];
const MAX_NEW_TOKENS: usize = 192;
const PROMPT: &str = "import json\nfrom pathlib import Path\n\n\ndef load_config(path: Path) -> dict:\n    \
                      \"\"\"Read a JSON config file and return it as a dict, with defaults filled in.\"\"\"\n";

/// The models to run and a label for the output.
struct Models {
    target: PathBuf,
    draft: PathBuf,
    label: String,
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The last two components of a model folder path (`smollm2-135m-instruct/fp32`), for labels.
fn short(path: &Path) -> String {
    let parts: Vec<_> = path.components().rev().take(2).collect();
    parts
        .iter()
        .rev()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

fn find_models() -> Option<Models> {
    if let Some(target) = env_path("SPECRT_BENCH_TARGET") {
        let draft = env_path("SPECRT_BENCH_DRAFT").unwrap_or_else(|| target.clone());
        let label = if draft == target {
            format!("{} (own draft)", short(&target))
        } else {
            format!("{} + draft {}", short(&target), short(&draft))
        };
        return Some(Models {
            target,
            draft,
            label,
        });
    }
    let cache = env_path("SPECRT_CACHE_DIR")
        .or_else(|| env_path("HOME").map(|h| h.join(".cache/specrt")))?;
    let smol = cache.join("models/smollm2-135m-instruct");
    let (target, draft) = (smol.join("fp32"), smol.join("fp32-L6"));
    if target.join("model.onnx").is_file() && draft.join("model.onnx").is_file() {
        return Some(Models {
            target,
            draft,
            label: "smollm2-135m fp32 + L6 draft".to_owned(),
        });
    }
    let tiny = env_path("SPECRT_TEST_MODEL")?;
    Some(Models {
        label: format!("{} (own draft)", short(&tiny)),
        target: tiny.clone(),
        draft: tiny,
    })
}

/// Token ids of [`PROMPT`] from the target folder's tokenizer, or fixed ids when it has none.
fn prompt_ids(folder: &Path, vocab: usize) -> Vec<u32> {
    let encoded =
        specrt_ort::specrt_text::tokenizer::Tokenizer::from_file(folder.join("tokenizer.json"))
            .ok()
            .and_then(|t| t.encode(PROMPT, true).ok());
    #[allow(clippy::cast_possible_truncation)]
    encoded.unwrap_or_else(|| (0..40).map(|i| ((i * 7 + 3) % vocab) as u32).collect())
}

/// Rounds run for one K, with the engine's timers summed over them.
#[derive(Default)]
struct Totals {
    n_rounds: u64,
    n_emitted: u64,
    wall: Duration,
    draft_ms: f64,
    target_ms: f64,
    core_ms: f64,
}

impl Totals {
    /// Add what the engine counted since `base` (both from the same generation).
    fn add(&mut self, now: &Stats, base: &Stats) {
        self.n_rounds += now.n_rounds - base.n_rounds;
        self.n_emitted += now.n_emitted() - base.n_emitted();
        self.draft_ms += now.draft_ms - base.draft_ms;
        self.target_ms += now.target_ms - base.target_ms;
        self.core_ms += now.core_ms - base.core_ms;
    }

    #[allow(clippy::cast_precision_loss)]
    fn line(&self, k: usize) -> String {
        let n = self.n_rounds.max(1) as f64;
        format!(
            "K={k}: {:.3} ms/round total, draft {:.3}, target {:.3}, verify+bookkeeping {:.4}, {:.2} tokens/round \
             ({} rounds)",
            self.wall.as_secs_f64() * 1e3 / n,
            self.draft_ms / n,
            self.target_ms / n,
            self.core_ms / n,
            self.n_emitted as f64 / n,
            self.n_rounds
        )
    }
}

/// Runs timed rounds of one configuration through the driver, restarting finished generations untimed.
struct Runner<'a> {
    driver: &'a mut Driver,
    prompt: &'a [u32],
    request: GenerationRequest,
    /// The running generation.
    id: Option<u64>,
    base: Stats,
    totals: Totals,
}

impl Runner<'_> {
    /// Submit the generation again and run its first step (the prefill and a round), untimed.
    fn restart(&mut self) {
        let id = self
            .driver
            .submit_ids(self.prompt, &self.request)
            .expect("submit");
        self.id = Some(id);
        self.base = Stats::default();
        self.step();
    }

    /// One step of the driver; accounts the generation's counts when it ends.
    fn step(&mut self) {
        for event in black_box(self.driver.step().expect("step")) {
            if let Some((_, output)) = event.done {
                self.totals.add(&output.stats, &self.base);
                self.id = None;
            }
        }
    }

    /// Time `iters` rounds (criterion's `iter_custom`).
    fn rounds(&mut self, iters: u64) -> Duration {
        let mut elapsed = Duration::ZERO;
        for _ in 0..iters {
            while self.id.is_none() {
                self.restart();
            }
            let t0 = Instant::now();
            self.step();
            elapsed += t0.elapsed();
        }
        self.totals.wall += elapsed;
        self.account();
        elapsed
    }

    /// Move the running generation's counts since `base` into the totals.
    fn account(&mut self) {
        if let Some(now) = self.id.and_then(|id| self.driver.stats(id)).cloned() {
            self.totals.add(&now, &self.base);
            self.base = now;
        }
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned())
}

fn main() {
    let Some(models) = find_models() else {
        eprintln!(
            "rounds bench: no model found. Get one with\n  specrt models pull smollm2-135m-instruct && \
             python -c \"from specrt import models; models.truncated('smollm2-135m-instruct', 6)\"\n\
             or set SPECRT_BENCH_TARGET (and SPECRT_BENCH_DRAFT) to converted model folders, or SPECRT_TEST_MODEL \
             to the tiny model of `make test-rs` (target/test-model/model)."
        );
        return;
    };
    let library = match find_ort_library(None) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rounds bench: skipped: {e}");
            return;
        }
    };
    let mut options = OrtOptions::new(&library);
    options.max_seq_len = Some(512);
    let mut pipeline = Driver::load_single(
        &models.target,
        Some(&models.draft),
        &options,
        DEFAULT_PREFIX_CACHING,
    )
    .expect("load the models");
    let mut prompt = prompt_ids(&models.target, pipeline.vocab_size());
    // Leave room for the generation in small models (the tiny model holds 256 positions).
    prompt.truncate(pipeline.max_seq_len() / 4);
    let max_new_tokens = MAX_NEW_TOKENS.min(pipeline.max_seq_len() - prompt.len());
    println!(
        "rounds bench: {} | {} logical CPUs ({}) | {} intra-op threads | prompt {} tokens | {}",
        models.label,
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        cpu_model(),
        options.effective_intra_op_threads(),
        prompt.len(),
        library.display()
    );

    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8))
        .configure_from_args();
    let mut lines = Vec::new();
    {
        let mut group = criterion.benchmark_group(format!("round {}", models.label));
        for k in KS {
            let request = GenerationRequest {
                max_new_tokens,
                num_speculative_tokens: SpeculativeTokens::Fixed(k),
                proposer: Some(Proposer::DraftModel),
                temperature: Some(0.0),
                ignore_eos: true,
                ..GenerationRequest::default()
            };
            let mut runner = Runner {
                driver: &mut pipeline,
                prompt: &prompt,
                request,
                id: None,
                base: Stats::default(),
                totals: Totals::default(),
            };
            group.bench_function(format!("k={k}"), |b| {
                b.iter_custom(|iters| runner.rounds(iters));
            });
            lines.push(runner.totals.line(k));
        }
        group.finish();
    }
    criterion.final_summary();
    println!(
        "\nsplit per round ({}; all rounds criterion ran, warm-up included):",
        models.label
    );
    for line in lines {
        println!("  {line}");
    }
}
