"""Outputs stay where they belong: hostile names never leave reports/ or --out, escaped in HTML; a failed write
leaves the previous set; an oversized grid is refused before anything is allocated."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nnmem_sweep import grid as grid_mod
from nnmem_sweep import outputs, paths
from nnmem_sweep.cli import main
from nnmem_sweep.config import parse_scenario_text
from nnmem_sweep.runner import run_scenario, write_outputs

HOSTILE = ["<script>alert(1)</script>", "\"quoted\" 'name'", "../../../etc/passwd", "a/b\\c", "..", ".hidden",
           "", "   ", "ünïcødé ✓", "a\x00b", "CON", "-rf"]

SCENARIO = """\
name: {name}
model: {{name: 20M, params: 20000000, activation_elements_per_sample: 1000000}}
grid: {{batch: [1, 8], precision: fp32, optimizer: [sgd, adamw]}}
gpus: [t4]
"""


def scenario_yaml(name: str) -> str:
    # a YAML double-quoted scalar holds any of the hostile names
    quoted = '"' + name.replace("\\", "\\\\").replace('"', '\\"').replace("\x00", "\\0") + '"'
    return SCENARIO.format(name=quoted)


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


@given(st.text(max_size=60))
def test_safe_stem_is_one_plain_path_component(name):
    stem = paths.safe_stem(name)
    assert stem and not stem.startswith((".", "-")) and ".." not in stem
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in stem)
    target = (Path("reports") / stem).resolve()
    assert target.parent == Path("reports").resolve()


@pytest.mark.parametrize("stem", ["<script>alert(1)<", "\"q\" 'x'", "..", "...x", "ünï ✓", "-rf"])
def test_default_output_folder_stays_under_reports(tmp_path, monkeypatch, stem, capsys):
    # the default --out comes from the config file's stem; the scenario name is hostile as well
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "in" / f"{stem}.yaml"
    cfg.parent.mkdir()
    cfg.write_text(scenario_yaml("../../<script>\"x\"/'y'"))
    before = files_under(tmp_path)
    assert main(["run", str(cfg), "-q"]) == 0
    new = files_under(tmp_path) - before
    out = tmp_path / "reports" / paths.safe_stem(Path(cfg).stem)
    assert new == {out / "results.csv", out / "max_batch.csv", out / "run.json"}
    printed = capsys.readouterr().out.split()
    assert [Path(p).resolve() for p in printed] == [out / "results.csv", out / "max_batch.csv", out / "run.json"]


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("stream", [False, True])
def test_out_is_respected_and_nothing_is_written_elsewhere(tmp_path, monkeypatch, name, stream):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "s.yaml"
    cfg.write_text(scenario_yaml(name))
    out = tmp_path / "deep" / "out"
    before = files_under(tmp_path)
    args = ["run", str(cfg), "--out", str(out), "-q"] + (["--stream", "--chunk-rows", "3"] if stream else [])
    rc = main(args)
    new = files_under(tmp_path) - before
    if name == "":  # the loader refuses an empty name: exit 2 and nothing written at all
        assert (rc, new) == (2, set())
        return
    assert rc == 0
    assert new == {out / "results.csv", out / "max_batch.csv", out / "run.json"}
    assert not (tmp_path / "reports").exists()


def test_hostile_name_is_escaped_in_the_html_report_and_files_stay_in_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "s.yaml"
    cfg.write_text(scenario_yaml("<script>alert('x')</script> \"../../evil\""))
    out = tmp_path / "out"
    before = files_under(tmp_path)
    assert main(["report", str(cfg), "--out", str(out), "-q"]) == 0
    new = files_under(tmp_path) - before
    assert all(out in p.parents for p in new), new
    assert {p.name for p in new} >= {"report.html", "report.pdf", "results.csv", "max_batch.csv"}
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(" in html


@pytest.mark.parametrize("failure", ["disk full", "interrupted"])
def test_a_failed_write_leaves_the_previous_results_intact(tmp_path, monkeypatch, failure):
    sc = parse_scenario_text(scenario_yaml("atomic"))
    out = tmp_path / "out"
    first = write_outputs(run_scenario(sc), out)
    old = {p.name: p.read_bytes() for p in first}
    assert old["results.csv"].count(b"\n") == 1 + 4  # header + 2 batches x 2 optimizers x 1 GPU

    real_write = outputs._HashedFile.write

    def failing_write(self, data):
        real_write(self, bytes(memoryview(data).cast("B")[:100]))  # 100 bytes reach the staged file, then:
        if failure == "interrupted":
            raise KeyboardInterrupt
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs._HashedFile, "write", failing_write)
    bigger = parse_scenario_text(scenario_yaml("atomic").replace("batch: [1, 8]", "batch: [1, 8, 32]"))
    with pytest.raises(OSError if failure == "disk full" else KeyboardInterrupt) as caught:
        write_outputs(run_scenario(bigger), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == old  # same files, same bytes
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no staging folder, no lock file left
    assert caught.value.__notes__ == [f"{out} is unchanged: it holds the previous complete set "
                                      f"(run {json.loads(old['run.json'])['run_id']}, finished "
                                      f"{json.loads(old['run.json'])['finished_utc']})"]


def test_a_grid_over_max_rows_is_refused_before_allocation_naming_size_and_override(tmp_path, monkeypatch, capsys):
    def never(*a, **k):
        raise AssertionError("the grid was built before its size was checked")

    monkeypatch.setattr(grid_mod, "product_frame", never)
    cfg = tmp_path / "s.yaml"
    cfg.write_text(scenario_yaml("big"))  # 2 batches x 2 optimizers x 1 GPU = 4 rows
    out = tmp_path / "out"
    for extra in ([], ["--stream"]):
        assert main(["run", str(cfg), "--out", str(out), "--max-rows", "3", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert "expands to 4 rows, over the limit of 3" in err and "--max-rows 4" in err
    assert not out.exists()
