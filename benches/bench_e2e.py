"""End-to-end benchmark: the same code as ``specrt bench`` (``specrt.bench``), runnable from a checkout.

    python benches/bench_e2e.py                 # default: 6 prompts x 128 tokens, K sweep, temperature sweep
    python benches/bench_e2e.py --quick         # a few minutes
    python benches/bench_e2e.py --no-sweeps --peers genai

Every option of ``specrt bench --help`` applies. Writes ``benches/out/<name>.json`` (+ PNGs) and prints the table.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from specrt.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
