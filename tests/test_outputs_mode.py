"""Regression: atomic writes went through mkstemp and left reports readable by their owner only (0600)."""
import os
import stat

from nnmem_sweep.paths import atomic_write_text


def test_atomic_write_gives_the_usual_file_mode(tmp_path):
    old = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "report.html", "<html></html>")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert path.read_text() == "<html></html>"
