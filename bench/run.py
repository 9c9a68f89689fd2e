"""Run every bench/bench_*.py in its own process and print their lines; exit 1 if any failed.

A script that cannot measure (bench_llm_analysis.py without llm-analysis installable) prints "NAME: SKIP: why" and
exits 0: the summary then names it as skipped, not passed.

    .venv/bin/python bench/run.py        (what `make bench` runs)
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SKIP = re.compile(r"^\S+: SKIP\b", re.MULTILINE)


def main() -> int:
    failed, skipped, passed = [], [], []
    for script in sorted(HERE.glob("bench_*.py")):
        done = subprocess.run([sys.executable, str(script)], cwd=HERE.parent, capture_output=True, text=True)
        out = (done.stdout + done.stderr).strip()
        print(out if out else f"{script.name}: no output (exit {done.returncode})", flush=True)
        if done.returncode != 0:
            failed.append(script.name)
        elif SKIP.search(out):
            skipped.append(script.name)
        else:
            passed.append(script.name)
    if failed:
        print(f"bench: FAIL in {', '.join(failed)}")
        return 1
    if skipped:
        print(f"bench: {len(passed)} PASS, SKIPPED (not measured): {', '.join(skipped)}")
        return 0
    print("bench: all PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
