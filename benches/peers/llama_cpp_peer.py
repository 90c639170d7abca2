"""llama.cpp as a peer of ``specrt bench``, on the very GGUF files specrt converted its models from.

Run by ``specrt bench --peers llama.cpp`` (``specrt.bench.run_peers``) as
``python3 benches/peers/llama_cpp_peer.py REQUEST.json RESULT.json``; standard library only. The binaries come from
``benches/peers/setup_llama_cpp.sh`` (llama.cpp vendored in llama-cpp-python's sdist, built here).

Request (JSON): ``bin_dir`` (holds ``llama-bench`` and ``llama-speculative-simple``), ``target_gguf``,
``draft_gguf``, ``prompts`` ({id: prompt text, chat template already rendered by specrt}), ``prompt_tokens``
({id: specrt's token count of that text}), ``max_new_tokens``, ``k`` (``--spec-draft-n-max``), ``repeats``,
``threads`` (0 = 2).

Per prompt and repetition, greedy (``--temp 0``):
- target-only: ``llama-bench -p 0 -n max_new_tokens -d <prompt tokens> -r 1``: token generation at the prompt's
  context depth (llama-bench's own timer; no prompt processing in the figure).
- speculative: ``llama-speculative-simple --spec-type draft-simple --spec-draft-n-max k`` on the prompt text; its
  "decoded N tokens in S seconds" line is the decode figure (prompt encoding excluded), with its n_drafted / n_accept.
  Other draft settings are llama.cpp's defaults (e.g. ``--spec-draft-p-min``).

Result (JSON): ``versions`` (llama.cpp build commit and number), ``k``, and per prompt ``target_only`` /
``speculative`` ``{"decode_tokens_per_s": spread, ...}``, ``speedup`` (paired decode tokens/s ratio),
``acceptance_rate`` (spread of n_accept / n_drafted per repetition; the totals in ``n_drafted`` / ``n_accept``),
``text`` (the speculative run's first output).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from peer_stats import spread

_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
# Log lines carry a timestamp and level prefix ("0.10.169.567 I n_drafted = 10").
_FIELD = re.compile(r"\b(n_drafted|n_accept|n_predict)\s*=\s*(\d+)")


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def target_only(bin_dir: Path, gguf: str, n: int, depth: int, threads: int) -> tuple[float, dict[str, Any]]:
    """Token generation tokens/s of ``gguf`` at context depth ``depth`` (one llama-bench repetition)."""
    cmd = [str(bin_dir / "llama-bench"), "-m", gguf, "-p", "0", "-n", str(n), "-d", str(depth)]
    cmd += ["-t", str(threads), "-r", "1", "-o", "json"]
    rows = json.loads(_run(cmd).stdout)
    row = rows[0]
    return float(row["avg_ts"]), {"build_commit": row.get("build_commit"), "build_number": row.get("build_number")}


def speculative(bin_dir: Path, target: str, draft: str, prompt: str, n: int, k: int, threads: int) -> dict[str, Any]:
    """One greedy llama-speculative-simple run: decode tokens/s, drafted / accepted counts and the text."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
        f.write(prompt)
        prompt_file = f.name
    try:
        cmd = [str(bin_dir / "llama-speculative-simple"), "-m", target, "-md", draft, "-f", prompt_file]
        cmd += ["-n", str(n), "--temp", "0", "-t", str(threads), "-td", str(threads), "-c", "4096"]
        cmd += ["--spec-type", "draft-simple", "--spec-draft-n-max", str(k)]
        proc = _run(cmd)
    finally:
        Path(prompt_file).unlink(missing_ok=True)
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
    out: dict[str, Any] = {"k": k, "versions": {"llama_cpp_python_sdist": req.get("llama_cpp_python")}, "prompts": {}}
    for pid, text in req["prompts"].items():
        depth = int(req["prompt_tokens"][pid])
        base, spec = [], []
        for _ in range(repeats):
            tps, versions = target_only(bin_dir, req["target_gguf"], n, depth, threads)
            out["versions"].update(versions)
            base.append(tps)
            spec.append(speculative(bin_dir, req["target_gguf"], req["draft_gguf"], text, n, k, threads))
        drafted = sum(s["n_drafted"] or 0 for s in spec)
        accepted = sum(s["n_accept"] or 0 for s in spec)
        out["prompts"][pid] = {
            "target_only": {"decode_tokens_per_s": spread(base)},
            "speculative": {
                "decode_tokens_per_s": spread([s["decode_tokens_per_s"] for s in spec]),
                "n_emitted": spread([s["n_emitted"] for s in spec]),
            },
            "speedup": spread([s["decode_tokens_per_s"] / b for b, s in zip(base, spec, strict=True)]),
            "acceptance_rate": spread([s["n_accept"] / s["n_drafted"] for s in spec if s["n_drafted"]]),
            "n_drafted": drafted,
            "n_accept": accepted,
            "text": spec[0]["text"],
        }
        print(pid, out["prompts"][pid]["target_only"], out["prompts"][pid]["speculative"], flush=True)
    Path(res_path).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
