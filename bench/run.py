"""Run every bench/bench_*.py in its own process and print their lines; exit 1 if any failed.

    .venv/bin/python bench/run.py        (what `make bench` runs)
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    failed = []
    for script in sorted(HERE.glob("bench_*.py")):
        done = subprocess.run([sys.executable, str(script)], cwd=HERE.parent, capture_output=True, text=True)
        out = (done.stdout + done.stderr).strip()
        print(out if out else f"{script.name}: no output (exit {done.returncode})", flush=True)
        if done.returncode != 0:
            failed.append(script.name)
    if failed:
        print(f"bench: FAIL in {', '.join(failed)}")
        return 1
    print("bench: all PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
