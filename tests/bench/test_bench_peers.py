"""The peers of ``specrt bench`` (``specrt.bench.peers`` and the scripts in ``specrt/bench/peer_scripts``): the scripts
ship inside the package and run from an installed layout, and the llama.cpp peer survives a crashing ``llama-bench``.

No llama.cpp build is needed: stand-in tools (small Python scripts) print what the real ones print and log how they
were called. The real-tool and real-venv tests of the peers are in ``tests/bench/test_bench.py``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import specrt
from specrt import bench

REPO = Path(__file__).resolve().parents[2]

PROMPTS = [
    bench.Prompt(id="raw", kind="code_completion", prompt="def add(a, b):"),
    bench.Prompt(id="chat", kind="chat_answer", prompt="<|im_start|>user\nhello there<|im_end|>\n"),
]
TEXTS = {"raw": "def add(a, b):", "chat": "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"}
TOKENS = {"raw": [1] * 5, "chat": [2] * 9}

# Every stand-in logs {"tool", "args", "prompt" (the -f file's text)} as one JSON line, then does its part.
_PRELUDE = """\
import json, os, signal, sys
args = sys.argv[1:]
entry = {{"tool": os.path.basename(sys.argv[0]), "args": args}}
if "-f" in args:
    with open(args[args.index("-f") + 1], encoding="utf-8") as f:
        entry["prompt"] = f.read()
with open({log!r}, "a", encoding="utf-8") as f:
    f.write(json.dumps(entry) + "\\n")
"""


def _prints(stderr: str = "", stdout: str = "") -> str:
    """A stand-in's body that writes ``stderr`` and ``stdout``."""
    return f"sys.stderr.write({stderr!r})\nsys.stdout.write({stdout!r})\n"


_BUILD = "build: 42 (abc1234) with cc (GCC) 13.2.0 for x86_64-linux-gnu\n"
# llama-bench's JSON (as of llama-cpp-python 0.3.36's llama.cpp), and the ways it was seen to fail or could.
LLAMA_BENCH = {
    "works": _prints(stdout='[{"build_commit": "abc1234", "build_number": 42, "n_depth": 9, "avg_ts": 10.0}]\n'),
    # What `llama-bench -d 51` does on an AVX-512 + AMX Xeon: killed by SIGSEGV (no core file here).
    "sigsegv": "import resource\nresource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
    + _prints(stderr="llama-bench: loading model\n")
    + "sys.stderr.flush()\nos.kill(os.getpid(), signal.SIGSEGV)\n",
    "exit": _prints(stderr="error: failed to create context\n") + "sys.exit(3)\n",
    "garbage": _prints(stdout="| model | size | params | backend | threads | test | t/s |\n"),
    "no_rows": _prints(stdout="[]\n"),
}
_SPECULATIVE = _prints(
    stderr=_BUILD
    + "encoded   12 tokens in    0.100 seconds, speed:  120.000 t/s\n"
    + "decoded   16 tokens in    1.000 seconds, speed:   16.000 t/s\n\n"
    + "n_draft   = 3\nn_predict = 16\nn_drafted = 12\nn_accept  = 9\naccept    = 75.000%\n"
    + "common_perf_print:        eval time =     250.00 ms /     5 runs   (   50.00 ms per token,    20.00 tokens"
    + " per second)\n",
    stdout=" hello world\n",
)
# llama-completion's perf counters: the prompt's batch, then the one-token decodes (12.5 tokens/s).
_COMPLETION = _prints(
    stderr=_BUILD
    + "common_perf_print: prompt eval time =     100.00 ms /    12 tokens (    8.33 ms per token,   120.00 tokens"
    + " per second)\n"
    + "common_perf_print:        eval time =    1200.00 ms /    15 runs   (   80.00 ms per token,    12.50 tokens"
    + " per second)\n",
    stdout=" hello world\n",
)


def _stand_ins(bin_dir: Path, log: Path, llama_bench: str, completion: bool = True) -> None:
    """llama-bench (``LLAMA_BENCH[llama_bench]``), llama-speculative-simple and, if ``completion``, llama-completion."""
    bin_dir.mkdir()
    tools = {"llama-bench": LLAMA_BENCH[llama_bench], "llama-speculative-simple": _SPECULATIVE}
    if completion:
        tools["llama-completion"] = _COMPLETION
    for name, body in tools.items():
        script = bin_dir / name
        script.write_text(f"#!{sys.executable}\n" + _PRELUDE.format(log=str(log)) + body, encoding="utf-8")
        script.chmod(0o755)


def _calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def _run_llama_cpp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bin_dir: Path) -> dict:
    monkeypatch.setattr(bench.peers, "gguf_source", lambda path: Path(path) / "fake.gguf")
    cfg = bench.BenchConfig(
        k=3, max_new_tokens=16, repeats=2, threads=2, peers=("llama.cpp",), llama_cpp_bin=str(bin_dir),
        out_dir=str(tmp_path / "out"),
    )  # fmt: skip
    out = bench.run_peers(cfg, tmp_path / "target", tmp_path / "draft", PROMPTS, TOKENS, TEXTS)
    return out["llama.cpp"]


def test_peer_scripts_ship_inside_the_package_and_import_no_specrt() -> None:
    package_dir = Path(specrt.bench.__file__).resolve().parent / "peer_scripts"
    for name in bench.peers.PEER_SCRIPTS:
        path = bench.peers.peer_script(name)
        assert path.resolve().parent == package_dir and path.is_file()
        # Standalone scripts run under a peer's own python, which has no specrt: they import only peer_stats beside.
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add((node.module or "").split(".")[0])
        assert "specrt" not in imported and "peer_stats" in imported, name
    assert (package_dir / "peer_stats.py").is_file()
    assert not list((REPO / "benches" / "peers").glob("*.py"))  # one copy only: the shipped one
    with pytest.raises(FileNotFoundError, match=r"'vllm_peer.py' is unknown \(expected one of: genai_peer.py, hf_p"):
        bench.peers.peer_script("vllm_peer.py")


def test_an_installed_layout_runs_the_llama_cpp_peer_without_the_repository(tmp_path) -> None:
    # specrt as a wheel lays it out: <site-packages>/specrt/..., with no benches/ anywhere near it.
    site = tmp_path / "site-packages"
    source = Path(specrt.__file__).resolve().parent
    shutil.copytree(source, site / "specrt", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for lib in source.glob("*.so"):
        (site / "specrt" / lib.name).symlink_to(lib)
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    _stand_ins(bin_dir, log, "works")
    driver = textwrap.dedent(
        f"""
        import json, sys
        from pathlib import Path
        sys.path.insert(0, {str(site)!r})
        import specrt
        from specrt import bench
        assert specrt.__file__.startswith({str(site)!r}), specrt.__file__
        bench.peers.gguf_source = lambda path: Path(path) / "fake.gguf"
        cfg = bench.BenchConfig(k=3, max_new_tokens=16, repeats=1, peers=("llama.cpp",), llama_cpp_bin={str(bin_dir)!r},
                                out_dir={str(tmp_path / "out")!r})
        prompts = [bench.Prompt(id="raw", kind="code_completion", prompt="def add(a, b):")]
        out = bench.run_peers(cfg, Path("t"), Path("d"), prompts, {{"raw": [1] * 5}}, {{"raw": "def add(a, b):"}})
        lookup = getattr(bench.peers, "peer_script", None)  # None: a specrt without it (to show the old failure)
        script = lookup and str(lookup("llama_cpp_peer.py"))
        print(json.dumps({{"script": script, "peer": out["llama.cpp"]}}))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", driver], capture_output=True, text=True, check=False, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    peer = result["peer"]
    assert peer["status"] == "ok", peer.get("stderr_tail") or peer.get("reason")
    assert result["script"] == str(site / "specrt" / "bench" / "peer_scripts" / "llama_cpp_peer.py")
    assert peer["prompts"]["raw"]["target_only_method"] == "llama-bench -d"
    assert [c["tool"] for c in _calls(log)] == ["llama-bench", "llama-speculative-simple"]


def test_llama_cpp_peer_measures_target_only_with_llama_bench_at_the_prompt_depth(tmp_path, monkeypatch) -> None:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    _stand_ins(bin_dir, log, "works")
    g = _run_llama_cpp(tmp_path, monkeypatch, bin_dir)
    assert g["status"] == "ok", g.get("stderr_tail")
    assert g["target_only_fallback"] is None
    for pid in ("raw", "chat"):
        p = g["prompts"][pid]
        assert p["target_only_method"] == "llama-bench -d" and "target_only_error" not in p
        assert p["target_only"]["decode_tokens_per_s"]["median"] == 10.0 and p["speedup"]["median"] == 1.6
    depths = [c["args"][c["args"].index("-d") + 1] for c in _calls(log) if c["tool"] == "llama-bench"]
    assert depths == ["5", "5", "9", "9"]
    _, rows, _ = bench.report._peer_rows({"main": {"prompts": []}, "peers": {"llama.cpp": g}})
    assert [r[1] for r in rows] == ["llama.cpp K=3", "llama.cpp K=3"]


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        ("sigsegv", "llama-bench -m .* killed by SIGSEGV \\(signal 11\\)"),
        ("exit", "llama-bench -m .* exited 3: error: failed to create context"),
        ("garbage", "llama-bench printed no result row \\(JSONDecodeError"),
        ("no_rows", "llama-bench printed no result row \\(IndexError"),
    ],
)
def test_llama_cpp_peer_falls_back_to_llama_completion_when_llama_bench_fails(
    tmp_path, monkeypatch, failure, reason
) -> None:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    _stand_ins(bin_dir, log, failure)
    g = _run_llama_cpp(tmp_path, monkeypatch, bin_dir)
    assert g["status"] == "ok", g.get("stderr_tail")
    assert g["target_only_fallback"]["tool"] == "llama-completion"
    assert re.search(reason, g["target_only_fallback"]["reason"], flags=re.DOTALL), g["target_only_fallback"]
    assert g["versions"]["build_commit"] == "abc1234" and g["versions"]["build_number"] == 42
    for pid in ("raw", "chat"):
        p = g["prompts"][pid]
        assert p["target_only_method"] == "llama-completion"
        # 12.50 is the stand-in's "eval time" line, not its "prompt eval time" (120) nor the speculative run's (20).
        assert p["target_only"]["decode_tokens_per_s"] == {"median": 12.5, "min": 12.5, "max": 12.5, "n": 2}
        assert p["speedup"]["median"] == pytest.approx(16.0 / 12.5)
        assert p["speculative"]["decode_tokens_per_s"]["median"] == 16.0 and p["n_drafted"] == 24
    calls = _calls(log)
    # llama-bench once (its failure is remembered for the run), then the fallback for every prompt and repetition.
    assert [c["tool"] for c in calls].count("llama-bench") == 1
    completion = [c for c in calls if c["tool"] == "llama-completion"]
    speculative = [c for c in calls if c["tool"] == "llama-speculative-simple"]
    assert len(completion) == len(speculative) == 4
    # The same prompt text and settings as the speculative run, without the draft.
    assert (
        [c["prompt"] for c in completion]
        == [c["prompt"] for c in speculative]
        == [TEXTS["raw"]] * 2 + [TEXTS["chat"]] * 2
    )
    for c, s in zip(completion, speculative, strict=True):
        opts = {a: c["args"][i + 1] for i, a in enumerate(c["args"][:-1]) if a in ("-m", "-n", "--temp", "-t", "-c")}
        assert opts == {a: s["args"][s["args"].index(a) + 1] for a in opts}
        assert opts == {
            "-m": str(tmp_path / "target" / "fake.gguf"),
            "-n": "16",
            "--temp": "0",
            "-t": "2",
            "-c": "4096",
        }
        assert "-no-cnv" in c["args"] and "-md" not in c["args"]
    # The report names the method where it is not llama-bench -d.
    _, rows, _ = bench.report._peer_rows({"main": {"prompts": []}, "peers": {"llama.cpp": g}})
    assert [r[1] for r in rows] == ["llama.cpp K=3 (target-only: llama-completion)"] * 2
    assert rows[0][2] == "12.50" and rows[0][4] == "1.28"


def test_llama_cpp_peer_without_a_fallback_tool_still_reports_its_speculative_run(tmp_path, monkeypatch) -> None:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    _stand_ins(bin_dir, log, "sigsegv", completion=False)
    g = _run_llama_cpp(tmp_path, monkeypatch, bin_dir)
    assert g["status"] == "ok", g.get("stderr_tail")
    assert g["target_only_fallback"]["tool"] is None and "SIGSEGV" in g["target_only_fallback"]["reason"]
    p = g["prompts"]["chat"]
    assert p["target_only_method"] is None and p["target_only"]["decode_tokens_per_s"] is None
    assert p["speedup"] is None and p["speculative"]["decode_tokens_per_s"]["median"] == 16.0
    assert "killed by SIGSEGV" in p["target_only_error"]
    assert f"no fallback: no llama-completion / llama-cli in {bin_dir}" in p["target_only_error"]
    _, rows, _ = bench.report._peer_rows({"main": {"prompts": []}, "peers": {"llama.cpp": g}})
    assert [r[1] for r in rows] == ["llama.cpp K=3 (target-only: none)"] * 2
    assert rows[0][2] == "-" and rows[0][3] == "16.00" and rows[0][4] == "-"


def _installed_layout(tmp_path: Path) -> Path:
    """specrt copied as a wheel lays it out, ``<tmp>/site-packages/specrt``, with the built extension linked in."""
    site = tmp_path / "site-packages"
    source = Path(specrt.__file__).resolve().parent
    shutil.copytree(source, site / "specrt", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for lib in source.glob("*.so"):
        (site / "specrt" / lib.name).symlink_to(lib)
    return site


def test_an_installed_specrt_bench_needs_no_checkout_and_names_the_peer_setup_commands(tmp_path) -> None:
    from specrt.convert import convert
    from specrt.convert.tiny import write_tiny_gguf

    site, cache, work = _installed_layout(tmp_path), tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    model = convert(
        write_tiny_gguf(tmp_path / "t.gguf", arch="qwen2", seed=1, n_layers=2), tmp_path / "t", progress=False
    )
    pkg = site / "specrt" / "bench"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPECRT_CACHE_DIR")}
    env.update(PYTHONPATH=str(site), SPECRT_CACHE_DIR=str(cache))
    # Argument resolution as `specrt bench --peers genai,hf,llama.cpp --quick` does it; only the peers' checks run.
    driver = textwrap.dedent(
        """
        import argparse, json
        from pathlib import Path
        import specrt
        from specrt import bench
        parser = argparse.ArgumentParser()
        bench.add_arguments(parser)
        cfg = bench.config_from_args(parser.parse_args(["--peers", "genai,hf,llama.cpp", "--quick"]))
        prompts = bench.load_prompts(cfg.prompts_file, set_name=cfg.prompt_set)
        peers = bench.run_peers(cfg, Path("t"), Path("d"), prompts, {p.id: [1] for p in prompts}, {})
        print(json.dumps({
            "specrt": specrt.__file__, "checkout": bench.checkout_root() and str(bench.checkout_root()),
            "prompts_path": str(bench.default_prompts_path()), "prompts": [p.id for p in prompts],
            "venvs": {p: str(bench.default_peer_venv(p)) for p in ("genai", "hf")},
            "out_dir": str(bench.default_out_dir()), "warnings": bench.peer_warnings(cfg),
            "setup": {p: bench.setup_command(cfg, p) for p in ("genai", "hf", "llama.cpp")}, "peers": peers,
        }))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", driver], capture_output=True, text=True, check=False, cwd=work, env=env
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["specrt"] == str(site / "specrt" / "__init__.py") and got["checkout"] is None
    # The prompts ship in the package; the quick set is read from there.
    assert got["prompts_path"] == str(pkg / "prompts.json")
    assert got["prompts"] == ["peer_a_quicksort", "peer_d_mutex"]
    # Peer venvs in specrt's cache, reports in the current folder.
    venvs = {p: cache / "bench" / f"venv-{p}" for p in ("genai", "hf")}
    assert got["venvs"] == {p: str(v) for p, v in venvs.items()}
    assert got["out_dir"] == str(work / "specrt-bench-out")
    scripts = {p: pkg / "peer_setup" / f"setup_{p}_venv.sh" for p in ("genai", "hf")}
    scripts["llama.cpp"] = pkg / "peer_setup" / "setup_llama_cpp.sh"
    assert got["setup"] == {
        "genai": ["bash", str(scripts["genai"]), str(venvs["genai"])],
        "hf": ["bash", str(scripts["hf"]), str(venvs["hf"])],
        "llama.cpp": ["bash", str(scripts["llama.cpp"]), bench.peers.LLAMA_CPP_PYTHON_VERSION],
    }
    # Each missing peer is skipped with the exact command that sets it up.
    llama_bin = cache / "llama.cpp" / bench.peers.LLAMA_CPP_PYTHON_VERSION / "build" / "bin"
    missing = {
        "genai": f"no interpreter at {venvs['genai'] / 'bin' / 'python'}",
        "hf": f"no interpreter at {venvs['hf'] / 'bin' / 'python'}",
        "llama.cpp": f"no llama-bench / llama-speculative-simple in {llama_bin}",
    }
    for peer, what in missing.items():
        hint = f"set it up with `specrt bench --setup-peer {peer}` (runs `{shlex.join(got['setup'][peer])}`)"
        assert got["peers"][peer] == {"status": "skipped", "reason": f"{what}; {hint}"}
        assert f"peer {peer} will be skipped: {what}; {hint}" in got["warnings"]
    # No default path leads into a benches/ folder (there is none beside site-packages).
    assert "benches" not in json.dumps({k: got[k] for k in ("prompts_path", "venvs", "out_dir", "setup", "peers")})
    assert not (tmp_path / "benches").exists()
    # The shipped setup scripts are whole: without their DIR they say how to call them (nothing is installed).
    usage = subprocess.run(["bash", str(scripts["genai"])], capture_output=True, text=True, check=False)
    assert usage.returncode == 2 and "specrt bench --setup-peer genai" in usage.stderr

    # The whole `specrt bench --peers genai,llama.cpp` on a tiny model: skips both peers, writes ./specrt-bench-out.
    cli = [sys.executable, "-m", "specrt.cli", "bench", "--target", str(model), "--draft", str(model), "--quick"]
    cli += ["--no-sweeps", "--no-plots", "--no-progress", "--repeats", "1", "--peers", "genai,llama.cpp", "--name", "x"]
    proc = subprocess.run(cli, capture_output=True, text=True, check=False, cwd=work, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"peer genai: skipped: {missing['genai']}; set it up with `specrt bench --setup-peer genai`" in proc.stdout
    assert "peer llama.cpp: skipped: no llama-bench" in proc.stdout
    report = json.loads((work / "specrt-bench-out" / "x.json").read_text(encoding="utf-8"))
    assert [p["id"] for p in report["main"]["prompts"]] == ["peer_a_quicksort", "peer_d_mutex"]
    assert {p: report["peers"][p]["status"] for p in ("genai", "llama.cpp")} == {
        "genai": "skipped",
        "llama.cpp": "skipped",
    }
    # No git in an installed specrt: the record says its version instead.
    machine = report["machine"]
    assert machine["git_commit"] is None and machine["specrt_checkout"] is None
    assert machine["specrt_version"] == specrt.__version__


@pytest.mark.skipif(
    Path(specrt.__file__).resolve().parents[1] != REPO / "python", reason="specrt is not imported from this checkout"
)
def test_a_checkout_keeps_its_bench_defaults_and_one_prompt_file() -> None:
    assert bench.checkout_root() == REPO
    assert bench.default_out_dir() == REPO / "benches" / "out"
    assert bench.default_peer_venv("genai") == REPO / "benches" / "out" / "venv-genai"
    # benches/prompts.json is a relative link to the shipped file: one copy of the data.
    link = REPO / "benches" / "prompts.json"
    assert link.is_symlink() and not Path(os.readlink(link)).is_absolute()
    assert link.resolve() == bench.default_prompts_path().resolve() == REPO / "python/specrt/bench/prompts.json"
    # The checkout's setup scripts are thin wrappers of the shipped ones.
    for name in bench.peers.SETUP_SCRIPTS.values():
        assert f"python/specrt/bench/peer_setup/{name}" in (REPO / "benches" / "peers" / name).read_text(
            encoding="utf-8"
        )


def test_peer_setup_makes_venvs_only_in_new_or_empty_folders_or_existing_venvs(tmp_path) -> None:
    def command(python: Path) -> list[str]:
        return bench.setup_command(bench.BenchConfig(hf_python=str(python)), "hf")

    script = str(bench.peers.setup_script("hf"))
    assert command(tmp_path / "new" / "bin" / "python") == ["bash", script, str(tmp_path / "new")]
    (tmp_path / "empty").mkdir()
    assert command(tmp_path / "empty" / "bin" / "python")[2] == str(tmp_path / "empty")
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /x\n", encoding="utf-8")
    assert command(tmp_path / "venv" / "bin" / "python")[2] == str(tmp_path / "venv")
    # A folder that holds something else is never turned into a venv (over /usr it would take over the system python).
    other = tmp_path / "other"
    (other / "bin").mkdir(parents=True)
    (other / "keep.txt").write_text("mine\n", encoding="utf-8")
    for python in (Path("/usr/bin/python3"), other / "bin" / "python", tmp_path / "python"):
        with pytest.raises(ValueError, match=r"is not <venv>/bin/python of a new folder or an existing virtual env"):
            command(python)
    # The shipped script refuses such a folder too, before it creates or installs anything.
    proc = subprocess.run(["bash", script, str(other)], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "is not a virtual environment: refusing" in proc.stderr
    assert sorted(p.name for p in other.iterdir()) == ["bin", "keep.txt"] and not any((other / "bin").iterdir())
