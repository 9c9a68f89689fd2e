"""Regression: an unwritable --out ended in an OSError traceback instead of one line and exit 2."""
import subprocess
import sys
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "simple-params.yaml"


def test_unwritable_out_is_one_line_exit_2(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = subprocess.run([sys.executable, "-m", "nnmem_sweep.cli", "run", str(CONFIG), "--out", str(blocker / "x"),
                           "-q"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nnmem-sweep: cannot write") and "Not a directory" in lines[0]
    assert blocker.read_text() == "not a folder"
