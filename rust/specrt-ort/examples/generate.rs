//! Generate text from Rust alone with [`specrt_ort::Pipeline`]'s text API (the target folder's tokenizer.json,
//! stop strings, incremental detokenization: `specrt-text`): print the text as it is committed (stdout), then
//! statistics (stderr).
//!
//! ```text
//! cargo run --release -p specrt-ort --example generate -- \
//!     --target ~/.cache/specrt/models/smollm2-135m-instruct/fp32 \
//!     --draft ~/.cache/specrt/models/smollm2-135m-instruct/fp32-L6 \
//!     --prompt "The capital of France is" --max-new-tokens 16 --temperature 0
//! ```
//!
//! Model folders come from `specrt models pull NAME` / `specrt convert` (Python). The ONNX Runtime library is found
//! by [`specrt_ort::find_ort_library`] (`--ort-library`, `$SPECRT_ORT_LIBRARY`, `$ORT_DYLIB_PATH`, the onnxruntime
//! wheel of `$SPECRT_PYTHON`, else of the active venv, the `.venv` of the current folder or one above (`make
//! install`'s, so this runs right after `make run` in a checkout) or `python3`, a system install). Generation ends
//! at an EOS id of the target folder, a `--stop-token-id`, a `--stop` string or `--max-new-tokens`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;

use specrt_ort::specrt_core::{BatchOptions, GenerationOutput};
use specrt_ort::{
    find_ort_library, Driver, GenerationRequest, OrtOptions, Pipeline, Proposer, SpeculativeTokens,
    DEFAULT_MAX_SEQ_LEN,
};

const USAGE: &str = "\
usage: generate --target DIR [--draft DIR] --prompt TEXT [options]

  --target DIR                   target model folder (specrt convert / specrt models pull output)
  --draft DIR                    draft model folder (same vocabulary); omit for target-only decoding
  --prompt TEXT                  prompt text (encoded with the target folder's tokenizer.json); repeatable
                                 with --max-batch
  --max-batch N                  run the prompts together in batched rounds on N rows (folders in the
                                 batched layout, specrt convert --attention batched)
  --max-new-tokens N             most tokens to emit (default 128)
  --temperature T                0 = greedy (default: generation_config.json's, else 1)
  --top-k N, --top-p P, --min-p P, --repetition-penalty R
                                 logits processing (default: generation_config.json's, else off)
  --num-speculative-tokens K     draft tokens per round, 0 up to MAX_DRAFT_TOKENS, or auto (default 4)
  --proposer NAME                draft | ngram | ngram+draft | none (default: draft with --draft, else none)
  --stop TEXT                    stop string: the text ends before it (repeatable; may end mid-token)
  --stop-token-id ID             extra id that ends generation (repeatable)
  --chat                         the prompt is one user message, rendered with the folder's chat template
  --ignore-eos                   keep going past the EOS ids
  --json                         statistics as one JSON object on stderr (text, token ids, finish reason)
  --seed S                       random seed (default 0)
  --max-seq-len N                KV cache length per model (default 4096, as the Python CLI)
  --threads N                    ONNX Runtime intra-op threads (default: physical cores)
  --ort-library PATH             libonnxruntime.so.1.x (default: $SPECRT_ORT_LIBRARY, $ORT_DYLIB_PATH, the
                                 onnxruntime wheel of python3, then /usr/local/lib, /usr/lib, ...)
  -h, --help                     this text";

/// The command line, parsed.
struct Args {
    target: PathBuf,
    draft: Option<PathBuf>,
    /// One prompt, or with `--max-batch` one or more.
    prompts: Vec<String>,
    /// Run the prompts together in batched rounds on this many rows (`Driver`; batched-layout folders).
    max_batch: Option<usize>,
    ort_library: Option<PathBuf>,
    max_seq_len: usize,
    threads: Option<usize>,
    /// Statistics as one JSON object on stderr (text, token ids, finish reason, counts) instead of the table.
    json: bool,
    /// The prompt is one user message, rendered with the target folder's chat template.
    chat: bool,
    request: GenerationRequest,
}

/// A parse failure: the message names the flag.
struct UsageError(String);

/// `value` parsed as `T`, or an error naming `flag` and the text.
fn parse_value<T: FromStr>(flag: &str, value: &str, expected: &str) -> Result<T, UsageError> {
    value
        .parse()
        .map_err(|_| UsageError(format!("{flag}: {value:?} is not {expected}")))
}

fn parse_args(mut argv: impl Iterator<Item = String>) -> Result<Option<Args>, UsageError> {
    let mut target = None;
    let mut draft = None;
    let mut prompts = Vec::new();
    let mut max_batch = None;
    let mut ort_library = None;
    let mut max_seq_len = DEFAULT_MAX_SEQ_LEN;
    let mut threads = None;
    let mut r = GenerationRequest::default();
    let mut json = false;
    let mut chat = false;
    while let Some(flag) = argv.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        if flag == "--ignore-eos" {
            r.ignore_eos = true;
            continue;
        }
        if flag == "--json" {
            json = true;
            continue;
        }
        if flag == "--chat" {
            chat = true;
            continue;
        }
        // Every other flag takes a value: `--flag VALUE` or `--flag=VALUE`.
        let (flag, value) = match flag.split_once('=') {
            Some((f, v)) => (f.to_owned(), v.to_owned()),
            None => {
                let value = argv
                    .next()
                    .ok_or_else(|| UsageError(format!("{flag} needs a value")))?;
                (flag, value)
            }
        };
        let v = value.as_str();
        let f = flag.as_str();
        match f {
            "--target" => target = Some(PathBuf::from(v)),
            "--draft" => draft = Some(PathBuf::from(v)),
            "--prompt" => prompts.push(value.clone()),
            "--max-batch" => max_batch = Some(parse_value(f, v, "an integer >= 1")?),
            "--ort-library" => ort_library = Some(PathBuf::from(v)),
            "--max-new-tokens" => r.max_new_tokens = parse_value(f, v, "an integer >= 1")?,
            "--temperature" => r.temperature = Some(parse_value(f, v, "a number")?),
            "--top-k" => r.top_k = Some(parse_value(f, v, "an integer >= 0")?),
            "--top-p" => r.top_p = Some(parse_value(f, v, "a number")?),
            "--min-p" => r.min_p = Some(parse_value(f, v, "a number")?),
            "--repetition-penalty" => {
                r.repetition_penalty = Some(parse_value(f, v, "a number")?);
            }
            "--num-speculative-tokens" | "-k" => {
                r.num_speculative_tokens =
                    parse_value(f, v, &specrt_core::num_speculative_tokens_expected())?;
            }
            "--proposer" => {
                r.proposer = Some(
                    v.parse::<Proposer>()
                        .map_err(|e| UsageError(format!("{f}: {e}")))?,
                );
            }
            "--stop-token-id" => r.stop_token_ids.push(parse_value(f, v, "a token id")?),
            "--stop" => r.stop.push(value.clone()),
            "--seed" => r.seed = parse_value(f, v, "an integer 0 <= seed < 2**64")?,
            "--max-seq-len" => max_seq_len = parse_value(f, v, "an integer >= 1")?,
            "--threads" => threads = Some(parse_value(f, v, "an integer >= 1")?),
            _ => return Err(UsageError(format!("unknown flag {f} (see --help)"))),
        }
    }
    let target = target.ok_or_else(|| UsageError("--target DIR is required".to_owned()))?;
    if prompts.is_empty() {
        return Err(UsageError("--prompt TEXT is required".to_owned()));
    }
    if prompts.len() > 1 && max_batch.is_none() {
        return Err(UsageError(
            "--prompt is repeatable with --max-batch only (batched rounds)".to_owned(),
        ));
    }
    Ok(Some(Args {
        target,
        draft,
        prompts,
        max_batch,
        ort_library,
        max_seq_len,
        threads,
        json,
        chat,
        request: r,
    }))
}

/// Any failure after parsing: a specrt error, printed as is.
fn fail(message: impl std::fmt::Display) -> String {
    message.to_string()
}

fn print_stats(out: &GenerationOutput, n_prompt: usize) {
    let s = &out.stats;
    let opt =
        |v: Option<f64>, digits: usize| v.map_or("n/a".to_owned(), |x| format!("{x:.digits$}"));
    eprintln!();
    eprintln!("finish reason:        {}", out.finish_reason.as_str());
    eprintln!("prompt tokens:        {n_prompt}");
    eprintln!(
        "emitted tokens:       {} (accepted {}, recovered {}, bonus {})",
        s.n_emitted(),
        s.n_accepted,
        s.n_recovered,
        s.n_bonus
    );
    eprintln!(
        "rounds:               {} (drafted {}, of which n-gram {})",
        s.n_rounds, s.n_drafted, s.n_drafted_ngram
    );
    eprintln!("acceptance rate:      {}", opt(s.acceptance_rate(), 3));
    eprintln!(
        "mean tokens / round:  {}",
        opt(s.mean_tokens_per_round(), 2)
    );
    eprintln!(
        "time (ms):            prefill {:.1}, draft {:.1}, target {:.1}, verify+bookkeeping {:.1}",
        s.prefill_ms, s.draft_ms, s.target_ms, s.core_ms
    );
    eprintln!(
        "tokens/s:             {} decode, {} with prefill",
        opt(s.decode_tokens_per_s(), 1),
        opt(s.tokens_per_s(), 1)
    );
}

/// A request's statistics on stderr: the table, or with `json` one JSON object (text, token ids, finish reason,
/// log-probabilities (f32, shortest form), counts; `"index"`: the prompt's position in a batched run).
fn report(json: bool, index: Option<usize>, text: &str, prompt_ids: &[u32], o: &GenerationOutput) {
    if !json {
        print_stats(o, prompt_ids.len());
        return;
    }
    let mut summary = serde_json::json!({
        "text": text,
        "prompt_token_ids": prompt_ids,
        "token_ids": o.tokens,
        "finish_reason": o.finish_reason.as_str(),
        "logprobs": o.logprobs,
        "n_drafted": o.stats.n_drafted,
        "n_accepted": o.stats.n_accepted,
    });
    if let Some(i) = index {
        summary["index"] = i.into();
    }
    eprintln!("{summary}");
}

fn run(args: Args) -> Result<(), String> {
    let library = find_ort_library(args.ort_library.as_deref()).map_err(fail)?;
    let mut options = OrtOptions::new(library);
    options.max_seq_len = Some(args.max_seq_len);
    options.intra_op_threads = args.threads;
    if let Some(max_batch) = args.max_batch {
        return run_batched(&args, &options, max_batch);
    }
    let mut pipeline =
        Pipeline::load(&args.target, args.draft.as_deref(), &options).map_err(fail)?;

    // Settings errors before any output.
    pipeline.resolve(&args.request).map_err(fail)?;
    let tokenizer = pipeline
        .tokenizer()
        .ok_or_else(|| format!("{} has no tokenizer.json", args.target.display()))?;
    let prompt_ids = if args.chat {
        let message = serde_json::json!({"role": "user", "content": args.prompts[0]});
        pipeline.chat_prompt_ids(&[message]).map_err(fail)?
    } else {
        let ids = tokenizer.encode(&args.prompts[0], true).map_err(fail)?;
        print!("{}", args.prompts[0]); // a completion continues the prompt: show it
        ids
    };
    let mut stdout = std::io::stdout();
    let out = pipeline
        .generate_ids_text_stream(&prompt_ids, &args.request, |step| {
            print!("{}", step.text);
            let _ = stdout.flush();
            true
        })
        .map_err(fail)?;
    println!();
    report(args.json, None, &out.text, &prompt_ids, &out.output);
    Ok(())
}

/// All prompts at once in batched rounds (`Driver`): each request's text on stdout when it finishes
/// (`[i] text`), with `--json` one JSON object per request on stderr (as the single-stream one, plus `"index"`).
fn run_batched(args: &Args, options: &OrtOptions, max_batch: usize) -> Result<(), String> {
    let mut batch = Driver::load(
        &args.target,
        args.draft.as_deref(),
        options,
        max_batch,
        BatchOptions::default(),
    )
    .map_err(fail)?;
    let tokenizer = batch
        .tokenizer()
        .cloned()
        .ok_or_else(|| format!("{} has no tokenizer.json", args.target.display()))?;
    let mut ids = Vec::new();
    let mut prompts = Vec::new();
    for prompt in &args.prompts {
        let prompt_ids = if args.chat {
            let message = serde_json::json!({"role": "user", "content": prompt});
            batch.chat_prompt_ids(&[message]).map_err(fail)?
        } else {
            tokenizer.encode(prompt, true).map_err(fail)?
        };
        ids.push(batch.submit_ids(&prompt_ids, &args.request).map_err(fail)?);
        prompts.push(prompt_ids);
    }
    let mut done = std::collections::HashMap::new();
    while !batch.is_idle() {
        for event in batch.step().map_err(fail)? {
            if let Some(error) = event.error {
                return Err(fail(error));
            }
            if let Some(out) = event.done {
                done.insert(event.id, out);
            }
        }
    }
    for (i, id) in ids.iter().enumerate() {
        let (text, o) = &done[id];
        println!("[{i}] {text}");
        report(args.json, Some(i), text, &prompts[i], o);
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(UsageError(message)) => {
            eprintln!("error: {message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let SpeculativeTokens::Fixed(k) = args.request.num_speculative_tokens {
        if k > 0 && args.draft.is_none() && args.request.proposer.is_none() {
            eprintln!(
                "note: no --draft and no --proposer: target-only decoding (K = {k} is unused)"
            );
        }
    }
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
