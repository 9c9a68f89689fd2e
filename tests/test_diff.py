"""nnmem-sweep diff: which max-batch cells changed, fits -> does not fit first; scenarios read at a git revision.

The scenario is FORMULAS.md's worked example 1 (20,000,000 fp32 parameters, 1,000,000 activation elements per
sample, no overheads), so every max batch is hand-computable: total(b) = W + 4,000,000·b with
W = weights + grads (+ state) = 160,000,000 (sgd), 240,000,000 (sgd-momentum), 320,000,000 (adamw).
"""
from __future__ import annotations

import shutil
import subprocess

import pandas as pd
import pytest

from nnmem_sweep import diff as D
from nnmem_sweep.cli import main
from nnmem_sweep.config import parse_scenario_text
from nnmem_sweep.errors import UsageError
from nnmem_sweep.runner import run_scenario

BASE = """\
name: worked example 1
model: {name: 20M, params: 20000000, activation_elements_per_sample: 1000000}
mode: train
grid: {batch: [1, 8, 32], precision: fp32, optimizer: [sgd, sgd-momentum, adamw]}
gpus: [t4, rtx-4090]
overheads: {cuda_context: 0, cublas_workspace: 0, allocator_reserve: 0}
headroom: 0
"""
T4 = 15_628_312_249  # PyTorch-visible capacity of a T4 (catalog: 14.555 GiB, the low end of "14.56 GiB")
RTX4090 = 25_345_675_756  # the 4090's: 23.605 GiB, the low end of "23.61 GiB"


def run(text: str):
    return run_scenario(parse_scenario_text(text))


def cell(d: pd.DataFrame, optimizer: str, gpu: str) -> pd.Series:
    row = d[(d["optimizer"] == optimizer) & (d["gpu"] == gpu)]
    assert len(row) == 1, row
    return row.iloc[0]


def test_headroom_099_flips_cells_computed_by_hand():
    # W = 160e6 (sgd), 240e6 (sgd-momentum), 320e6 (adamw) bytes; 4e6 bytes per sample.
    # headroom 0: b_max = floor((15,628,312,249 − W) / 4,000,000) on the T4: sgd 3867, sgd-momentum 3847, adamw 3827;
    # on the 4090 (25,345,675,756): 6296, 6276, 6256.
    # headroom 0.99: usable = C − ceil(0.99·C): T4 156,283,122 (< every W + 4e6: nothing fits);
    # 4090 253,456,757: sgd floor(93,456,757 / 4e6) = 23, sgd-momentum floor(13,456,757 / 4e6) = 3, adamw 0.
    old, new = run(BASE), run(BASE.replace("headroom: 0", "headroom: 0.99"))
    assert int(new.max_batch["usable_bytes"][new.max_batch["gpu"] == "t4"].iloc[0]) == T4 - 15_472_029_127
    d = D.diff_max_batch(old, new)
    assert list(d[D.CHANGE]) == [D.FITS_TO_NOT] * 4 + [D.DECREASE] * 2
    expect = {("sgd", "t4"): (3867, 0), ("sgd-momentum", "t4"): (3847, 0), ("adamw", "t4"): (3827, 0),
              ("adamw", "rtx-4090"): (6256, 0), ("sgd", "rtx-4090"): (6296, 23),
              ("sgd-momentum", "rtx-4090"): (6276, 3)}
    for (opt, gpu), (o, n) in expect.items():
        r = cell(d, opt, gpu)
        assert (r[D.OLD], r[D.NEW], r[D.DELTA]) == (o, n, n - o)
    # the largest fall first within a group: adamw 4090 (−6256) before sgd T4 (−3867)
    assert (d.iloc[0]["optimizer"], d.iloc[0]["gpu"]) == ("adamw", "rtx-4090")
    # reversed: the same cells, as does not fit -> fits then increases
    back = D.diff_max_batch(new, old)
    assert list(back[D.CHANGE]) == [D.NOT_TO_FITS] * 4 + [D.INCREASE] * 2


def test_gpu_change_adds_and_removes_cells_and_unchanged_cells_are_left_out():
    old = run(BASE)
    new = run(BASE.replace("gpus: [t4, rtx-4090]", "gpus: [rtx-4090, a100-80gb]"))
    d = D.diff_max_batch(old, new)
    # rtx-4090 rows are identical on both sides and do not appear
    assert set(d["gpu"]) == {"t4", "a100-80gb"}
    assert (d[d["gpu"] == "a100-80gb"][D.CHANGE] == D.ADDED).all()
    assert (d[d["gpu"] == "t4"][D.CHANGE] == D.REMOVED).all()
    assert list(d[D.CHANGE]) == [D.ADDED] * 3 + [D.REMOVED] * 3
    r = cell(d, "sgd", "t4")
    assert r[D.OLD] == 3867 and r[D.NEW] is pd.NA


def test_same_scenario_diffs_empty_and_says_so():
    d = D.diff_max_batch(run(BASE), run(BASE))
    assert d.empty
    assert "no cell changed" in D.format_diff(d, "a", "b")


def test_cli_diff_two_files(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text(BASE)
    (tmp_path / "b.yaml").write_text(BASE.replace("headroom: 0", "headroom: 0.99"))
    assert main(["diff", str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("max batch: 6 cell(s) changed")
    assert out[1].startswith("fits -> does not fit (4)")
    assert out[2].strip() == "adamw  rtx-4090: 6256 -> 0"
    assert "  sgd  rtx-4090: 6296 -> 23" in out


def test_cli_diff_needs_two_files_or_against(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text(BASE)
    assert main(["diff", str(tmp_path / "a.yaml")]) == 2
    assert "OLD NEW" in capsys.readouterr().err


git = pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")


def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                   cwd=cwd, check=True, capture_output=True)


@git
def test_against_revision_reads_the_committed_file(tmp_path, capsys):
    sub = tmp_path / "configs"
    sub.mkdir()
    _git(tmp_path, "init", "-q")
    (sub / "s.yaml").write_text(BASE)
    _git(tmp_path, "add", "configs/s.yaml")
    _git(tmp_path, "commit", "-q", "-m", "base")
    (sub / "s.yaml").write_text(BASE.replace("headroom: 0", "headroom: 0.99"))
    assert D.scenario_text_at_revision(sub / "s.yaml", "HEAD") == BASE
    sc = D.scenario_at_revision(sub / "s.yaml", "HEAD")
    assert sc.headroom == 0.0
    assert main(["diff", str(sub / "s.yaml"), "--against", "HEAD"]) == 0
    out = capsys.readouterr().out
    assert "fits -> does not fit (4)" in out and "sgd  rtx-4090: 6296 -> 23" in out


@git
@pytest.mark.parametrize("rev,name,says", [
    ("no-such-rev", "s.yaml", "invalid object name"),
    ("HEAD", "other.yaml", "not in .HEAD."),
    ("--output=x", "s.yaml", "cannot start with '-'"),
])
def test_against_missing_revision_or_file_is_one_clean_line(tmp_path, capsys, rev, name, says):
    _git(tmp_path, "init", "-q")
    (tmp_path / "s.yaml").write_text(BASE)
    _git(tmp_path, "add", "s.yaml")
    _git(tmp_path, "commit", "-q", "-m", "base")
    (tmp_path / "other.yaml").write_text(BASE)
    with pytest.raises(UsageError, match=says):
        D.scenario_text_at_revision(tmp_path / name, rev)
    assert main(["diff", str(tmp_path / name), f"--against={rev}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@git
def test_provenance_marks_uncommitted_and_untracked_configs(tmp_path):
    assert D.provenance(tmp_path / "s.yaml") == D.Provenance(None, "not in a git repository")
    _git(tmp_path, "init", "-q")
    (tmp_path / "s.yaml").write_text(BASE)
    assert D.provenance(tmp_path / "s.yaml").state == "not in a git repository"  # no commit yet: no HEAD
    _git(tmp_path, "add", "s.yaml")
    _git(tmp_path, "commit", "-q", "-m", "base")
    clean = D.provenance(tmp_path / "s.yaml")
    assert clean.state == "committed" and not clean.dirty and len(clean.commit) == 40
    (tmp_path / "s.yaml").write_text(BASE + "# edited\n")
    assert D.provenance(tmp_path / "s.yaml") == D.Provenance(clean.commit, "uncommitted changes")
    (tmp_path / "new.yaml").write_text(BASE)
    assert D.provenance(tmp_path / "new.yaml").state == "not tracked by git"
    assert D.provenance(tmp_path / "new.yaml").dirty
