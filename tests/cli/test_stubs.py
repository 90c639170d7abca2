"""The hand-written stub python/specrt/_specrt.pyi checked against the built extension specrt._specrt with mypy's
stubtest (conventions item 13, "Ship typing")."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALLOWLIST = Path("python") / "specrt" / "stubtest-allowlist.txt"
STUBTEST = [sys.executable, "-m", "mypy.stubtest", "specrt._specrt", "--allowlist", str(ALLOWLIST)]

HOW_TO_FIX = """\
python/specrt/_specrt.pyi does not describe the built module specrt._specrt (stubtest exit code {rc}).

Each "error:" below names an object of specrt._specrt and what differs between the stub ("Stub:") and the module
("Runtime:"). Make the stub say what the module does:
  - a new function, class, method or property: add it, with real types and a one-line docstring (a new module-level
    name also goes into the stub's `__all__`, which pyo3 fills at runtime from every add_class / add_function);
  - a pyo3 class: mark it @typing.final, stub its #[new] as `def __new__(cls, ...) -> ClassName`, and its
    #[getter] / get_all fields as @property (read-only);
  - parameter names, kinds (positional / keyword-only) and defaults exactly as `inspect.signature` shows them.
If the runtime signature is what is wrong (a default shown as `Ellipsis`: pyo3 prints `...` for a non-literal Rust
default), fix the binding with `#[pyo3(signature = ..., text_signature = "...")]`, not the stub. stubtest checks the
installed extension: after changing Rust, rebuild (`make install`), or a stale build fails here. Where the binding
spells a `text_signature` out (optimal_k, RequestConfig), a parameter added to `signature` goes there too.
{allowlist} is only for what stubtest cannot check, one commented reason per entry.

Rerun from the repository root: {cmd}
----- stubtest output -----
{output}"""


def test_stub_matches_the_built_extension_module() -> None:
    proc = subprocess.run(STUBTEST, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    output = (proc.stdout + proc.stderr).strip()
    if "No module named mypy" in output:
        pytest.fail(
            f"mypy is not installed (it is in the test extra: pip install -e '.[test]'):\n{output}", pytrace=False
        )
    if proc.returncode != 0:
        cmd = shlex.join(["python", *STUBTEST[1:]])
        pytest.fail(HOW_TO_FIX.format(rc=proc.returncode, allowlist=ALLOWLIST, cmd=cmd, output=output), pytrace=False)
