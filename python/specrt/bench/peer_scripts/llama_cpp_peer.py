"""llama.cpp as a peer of ``specrt bench``, on the very GGUF files specrt converted its models from.

Run by ``specrt bench --peers llama.cpp`` (``specrt.bench.run_peers``) as
``python3 <site-packages>/specrt/bench/peer_scripts/llama_cpp_peer.py REQUEST.json RESULT.json``; standard library
only (it never imports specrt). The binaries come from ``specrt bench --setup-peer llama.cpp``
(``specrt/bench/peer_setup/setup_llama_cpp.sh``: llama.cpp vendored in llama-cpp-python's sdist, built here) or any
llama.cpp build.

Request (JSON): ``bin_dir`` (holds ``llama-bench`` and ``llama-speculative-simple``, optionally ``llama-completion``
or ``llama-cli``), ``target_gguf``, ``draft_gguf``, ``prompts`` ({id: prompt text, chat template already rendered by
specrt}), ``prompt_tokens`` ({id: specrt's token count of that text}), ``max_new_tokens``, ``k``
(``--spec-draft-n-max``), ``repeats``, ``threads`` (0 = 2).

Per prompt and repetition, greedy (``--temp 0``):
- target-only: ``llama-bench -p 0 -n max_new_tokens -d <prompt tokens> -r 1``: token generation at the prompt's
  context depth (llama-bench's own timer; no prompt processing in the figure). Where that fails (a signal: ``-d``
  crashes with SIGSEGV on an AVX-512 + AMX Xeon while the same run without ``-d`` works; a nonzero exit; no result
  row), llama-bench is not tried again in this run, and target-only is ``llama-completion`` (``llama-cli`` in builds
  before it) on the very prompt file, ``-n``, ``--temp 0``, ``-t`` and ``-c`` of the speculative run, without the
  draft: llama.cpp's own "eval time = ... tokens per second" counter of the target's one-token decodes after the
  prompt (prompt processing excluded, as above). llama-speculative-simple itself cannot run without a draft.
- speculative: ``llama-speculative-simple --spec-type draft-simple --spec-draft-n-max k`` on the prompt text; its
  "decoded N tokens in S seconds" line is the decode figure (prompt encoding excluded), with its n_drafted / n_accept.
  Other draft settings are llama.cpp's defaults (e.g. ``--spec-draft-p-min``).

Result (JSON): ``versions`` (llama.cpp build commit and number), ``k``, ``target_only_fallback`` (None, or
``{"reason": why llama-bench -d failed, "tool": the fallback used or None}``), and per prompt ``target_only`` /
``speculative`` ``{"decode_tokens_per_s": spread, ...}``, ``target_only_method`` (``"llama-bench -d"``,
``"llama-completion"``, ``"llama-cli"``, both joined by " + " if a prompt's repetitions differ, or None when no
method gave a figure; then ``target_only_error`` says why), ``speedup`` (paired decode tokens/s ratio),
``acceptance_rate`` (spread of n_accept / n_drafted per repetition; the totals in ``n_drafted`` / ``n_accept``),
``text`` (the speculative run's first output).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peer_stats import spread

#: The default target-only method (each prompt's ``target_only_method``).
LLAMA_BENCH_DEPTH = "llama-bench -d"
#: Where llama-bench -d fails: llama.cpp's plain completion tool, the first of these in ``bin_dir``
#: (``llama-completion`` since late 2025; ``llama-cli`` was that tool before it became the chat client).
FALLBACK_TOOLS = ("llama-completion", "llama-cli")
#: The context size of every run (the speculative run's ``-c``).
N_CTX = 4096

_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
# Log lines carry a timestamp and level prefix ("0.10.169.567 I n_drafted = 10").
_FIELD = re.compile(r"\b(n_drafted|n_accept|n_predict)\s*=\s*(\d+)")
# llama.cpp's perf counters (common_perf_print / llama_perf_context_print), e.g.
# "common_perf_print:        eval time =    9876.54 ms /   127 runs   (   77.77 ms per token,    12.86 tokens per
# second)"; "prompt eval time" is the prompt's batch, not token generation.
_EVAL = re.compile(
    r"(?<!prompt )eval time\s*=\s*([\d.]+) ms /\s*(\d+) runs\s*\(\s*[\d.]+ ms per token,\s*([\d.]+) tokens per second\)"
)
# "build: 6913 (3e7c2b1) with cc ... for x86_64-linux-gnu", printed by every llama.cpp tool at start.
_BUILD = re.compile(r"build:\s*(\d+)\s*\(([0-9a-fA-F]+)\)")


def _exit_text(returncode: int) -> str:
    """``exited 1`` or ``killed by SIGSEGV (signal 11)`` (subprocess gives -N for a process killed by signal N)."""
    if returncode >= 0:
        return f"exited {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name} (signal {-returncode})"
    except ValueError:
        return f"killed by signal {-returncode}"


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    # No stdin: a completion tool that falls into interactive mode must not wait for a terminal.
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        name = Path(cmd[0]).name
        raise RuntimeError(f"{name} {' '.join(cmd[1:3])} ... {_exit_text(proc.returncode)}: {proc.stderr[-2000:]}")
    return proc


def _build_info(log: str) -> dict[str, Any]:
    """``{"build_commit", "build_number"}`` from a tool's "build: N (commit)" line, or {} when it has none."""
    m = _BUILD.search(log)
    return {"build_commit": m.group(2), "build_number": int(m.group(1))} if m else {}


@contextlib.contextmanager
def _prompt_file(prompt: str) -> Iterator[str]:
    """The prompt text in a temporary file (``-f``: a chat-rendered prompt has newlines and special tokens)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
        f.write(prompt)
    try:
        yield f.name
    finally:
        Path(f.name).unlink(missing_ok=True)


def bench_target_only(bin_dir: Path, gguf: str, n: int, depth: int, threads: int) -> tuple[float, dict[str, Any]]:
    """Token generation tokens/s of ``gguf`` at context depth ``depth`` (one llama-bench repetition) and its build.

    Raises:
        RuntimeError: llama-bench exited nonzero or by a signal, or printed no result row with a positive ``avg_ts``.
    """
    cmd = [str(bin_dir / "llama-bench"), "-m", gguf, "-p", "0", "-n", str(n), "-d", str(depth)]
    cmd += ["-t", str(threads), "-r", "1", "-o", "json"]
    stdout = _run(cmd).stdout
    try:
        row = json.loads(stdout)[0]
        tps = float(row["avg_ts"])
    except (ValueError, LookupError, TypeError) as e:
        raise RuntimeError(f"llama-bench printed no result row ({type(e).__name__}: {e}): {stdout[-500:]!r}") from e
    if not (math.isfinite(tps) and tps > 0):
        raise RuntimeError(f"llama-bench reported avg_ts {tps!r} (expected a positive number)")
    return tps, {"build_commit": row.get("build_commit"), "build_number": row.get("build_number")}


def completion_target_only(
    bin_dir: Path, tool: str, gguf: str, prompt: str, n: int, threads: int
) -> tuple[float, dict[str, Any]]:
    """Token generation tokens/s of ``gguf`` after ``prompt`` (one greedy run of the completion tool ``tool``).

    The same prompt file, ``-n``, ``--temp 0``, ``-t`` and ``-c`` as :func:`speculative`, without the draft;
    ``-no-cnv``: plain completion of the rendered prompt, not a chat session. The figure is llama.cpp's "eval time"
    counter (one-token decodes after the prompt's batch), so prompt processing is left out as llama-bench leaves it.

    Raises:
        RuntimeError: the tool exited nonzero or by a signal, or printed no "eval time" line.
    """
    with _prompt_file(prompt) as prompt_path:
        cmd = [str(bin_dir / tool), "-m", gguf, "-f", prompt_path, "-n", str(n), "--temp", "0"]
        cmd += ["-t", str(threads), "-c", str(N_CTX), "-no-cnv"]
        proc = _run(cmd)
    log = proc.stderr + proc.stdout
    found = _EVAL.findall(log)
    if not found:
        raise RuntimeError(f"no 'eval time = ... tokens per second' line in {tool}'s output: {log[-2000:]}")
    tps = float(found[-1][2])
    if not (math.isfinite(tps) and tps > 0):
        raise RuntimeError(f"{tool} reported {tps!r} tokens per second (expected a positive number)")
    return tps, _build_info(log)


@dataclass
class TargetOnlyRun:
    """One target-only measurement: ``decode_tokens_per_s`` by ``method``, or None with the ``error``."""

    decode_tokens_per_s: float | None
    method: str | None
    error: str | None = None


class TargetOnly:
    """Target-only measurements of one run: llama-bench -d until it first fails, then the fallback tool.

    After one failure llama-bench is not run again (its crash is reproducible, and each try loads the model), so a
    run's figures share one method from that point on; :attr:`bench_error` keeps why.
    """

    def __init__(self, bin_dir: Path, gguf: str, n: int, threads: int, versions: dict[str, Any]) -> None:
        self.bin_dir, self.gguf, self.n, self.threads, self.versions = bin_dir, gguf, n, threads, versions
        self.bench_error: str | None = None
        self.fallback = next((t for t in FALLBACK_TOOLS if (bin_dir / t).is_file()), None)

    def measure(self, prompt: str, depth: int) -> TargetOnlyRun:
        """Decode tokens/s of the target after ``prompt`` (``depth`` tokens by specrt's count); never raises."""
        if self.bench_error is None:
            try:
                tps, build = bench_target_only(self.bin_dir, self.gguf, self.n, depth, self.threads)
            except RuntimeError as e:
                self.bench_error = str(e)
                print(f"llama-bench -d failed; target-only falls back to {self.fallback}: {e}", file=sys.stderr)
            else:
                self.versions.update(build)
                return TargetOnlyRun(tps, LLAMA_BENCH_DEPTH)
        if self.fallback is None:
            tools = " / ".join(FALLBACK_TOOLS)
            return TargetOnlyRun(None, None, f"{self.bench_error}; no fallback: no {tools} in {self.bin_dir}")
        try:
            tps, build = completion_target_only(self.bin_dir, self.fallback, self.gguf, prompt, self.n, self.threads)
        except RuntimeError as e:
            return TargetOnlyRun(None, None, f"{self.bench_error}; the fallback {self.fallback} failed too: {e}")
        for key, value in build.items():
            self.versions.setdefault(key, value)
        return TargetOnlyRun(tps, self.fallback)


def speculative(bin_dir: Path, target: str, draft: str, prompt: str, n: int, k: int, threads: int) -> dict[str, Any]:
    """One greedy llama-speculative-simple run: decode tokens/s, drafted / accepted counts, the text and the build."""
    with _prompt_file(prompt) as prompt_path:
        cmd = [str(bin_dir / "llama-speculative-simple"), "-m", target, "-md", draft, "-f", prompt_path]
        cmd += ["-n", str(n), "--temp", "0", "-t", str(threads), "-td", str(threads), "-c", str(N_CTX)]
        cmd += ["--spec-type", "draft-simple", "--spec-draft-n-max", str(k)]
        proc = _run(cmd)
    log = proc.stderr + proc.stdout
    m = _DECODED.search(log)
    if m is None:
        raise RuntimeError(f"no 'decoded ... tokens' line in llama-speculative-simple's output: {log[-2000:]}")
    fields = {k: int(v) for k, v in _FIELD.findall(log)}
    return {
        "decode_tokens_per_s": float(m.group(3)),
        "n_emitted": int(m.group(1)),
        "n_drafted": fields.get("n_drafted"),
        "n_accept": fields.get("n_accept"),
        "text": _after(proc.stdout, prompt),
        "versions": _build_info(log),
    }


def _after(stdout: str, prompt: str) -> str:
    """The generated text: stdout echoes the prompt first."""
    i = stdout.find(prompt)
    return (stdout[i + len(prompt) :] if i >= 0 else stdout).strip()


def main(req_path: str, res_path: str) -> int:
    req = json.loads(Path(req_path).read_text(encoding="utf-8"))
    bin_dir = Path(req["bin_dir"])
    threads = int(req.get("threads") or 2)
    n, k, repeats = int(req["max_new_tokens"]), int(req["k"]), int(req.get("repeats") or 1)
    versions: dict[str, Any] = {"llama_cpp_python_sdist": req.get("llama_cpp_python")}
    out: dict[str, Any] = {"k": k, "versions": versions, "target_only_fallback": None, "prompts": {}}
    target_only = TargetOnly(bin_dir, req["target_gguf"], n, threads, versions)
    for pid, text in req["prompts"].items():
        depth = int(req["prompt_tokens"][pid])
        base: list[TargetOnlyRun] = []
        spec: list[dict[str, Any]] = []
        for _ in range(repeats):
            base.append(target_only.measure(text, depth))
            spec.append(speculative(bin_dir, req["target_gguf"], req["draft_gguf"], text, n, k, threads))
            for key, value in spec[-1].pop("versions").items():
                versions.setdefault(key, value)
        drafted = sum(s["n_drafted"] or 0 for s in spec)
        accepted = sum(s["n_accept"] or 0 for s in spec)
        methods = list(dict.fromkeys(b.method for b in base if b.method))
        out["prompts"][pid] = {
            "target_only": {"decode_tokens_per_s": spread([b.decode_tokens_per_s for b in base])},
            "target_only_method": " + ".join(methods) or None,
            "speculative": {
                "decode_tokens_per_s": spread([s["decode_tokens_per_s"] for s in spec]),
                "n_emitted": spread([s["n_emitted"] for s in spec]),
            },
            "speedup": spread(
                [
                    s["decode_tokens_per_s"] / b.decode_tokens_per_s
                    for b, s in zip(base, spec, strict=True)
                    if b.decode_tokens_per_s
                ]
            ),
            "acceptance_rate": spread([s["n_accept"] / s["n_drafted"] for s in spec if s["n_drafted"]]),
            "n_drafted": drafted,
            "n_accept": accepted,
            "text": spec[0]["text"],
        }
        errors = [b.error for b in base if b.error]
        if errors:
            out["prompts"][pid]["target_only_error"] = errors[-1]
        print(pid, out["prompts"][pid]["target_only"], out["prompts"][pid]["speculative"], flush=True)
    if target_only.bench_error is not None:
        out["target_only_fallback"] = {"reason": target_only.bench_error, "tool": target_only.fallback}
    Path(res_path).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
