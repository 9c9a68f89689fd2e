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


def test_truth_takes_several_case_ids_after_one_only(tmp_path, capsys):
    """`nnmem-sweep truth --only A B` (as derive's --only reads them; before, only `--only A --only B`, and the
    first form was an argparse error): both ids read, unknown ones named in one line, exit 2, nothing written."""
    from nnmem_sweep.cli import main

    assert main(["truth", "--write", str(tmp_path / "t"), "--only", "no-such-a", "no-such-b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-a, no-such-b" in err[0]
    assert not (tmp_path / "t").exists()
