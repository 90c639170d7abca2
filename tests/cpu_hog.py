"""Keep every core busy: N busy-looping processes (N = the number of cores, or ``-n``), the load that other jobs put on
a CI machine. ``make test-load`` runs the timing tests under it.

    python tests/cpu_hog.py [-n N] -- COMMAND ...   # run COMMAND under the load; exit with its status
    python tests/cpu_hog.py [-n N] &                # load until killed (SIGTERM / SIGINT)

The busy processes end with this one: on COMMAND's end, on a failure, on Ctrl-C or SIGTERM, and (each one checks
that its parent is alive) when this process is killed outright.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from types import FrameType

# A busy loop that ends once its parent is gone (its parent id changes): no orphan keeps spinning after a SIGKILL.
_BUSY = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(200_000):
        pass
"""


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=os.cpu_count() or 1, help="busy processes (default: the number of cores)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...: run it under the load")
    a = ap.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    hogs: list[subprocess.Popen] = []
    try:
        hogs = [subprocess.Popen([sys.executable, "-c", _BUSY]) for _ in range(a.n)]
        print(f"cpu_hog: {a.n} busy processes on {os.cpu_count()} cores", file=sys.stderr, flush=True)
        if not command:
            signal.pause()  # until SIGTERM / SIGINT
            return 0
        with subprocess.Popen(command) as proc:
            try:
                return proc.wait()
            finally:
                if proc.poll() is None:  # interrupted: stop the command too
                    proc.terminate()
                    proc.wait()
    finally:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait()


if __name__ == "__main__":
    sys.exit(main())
