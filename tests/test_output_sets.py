"""Issue 15: an output folder is always one consistent set. A report stopped by a real signal at any moment leaves
the complete old set (or, once committed, the complete new one), never a mix and no temporary folder; two runs into
one folder never mix; a folder holding a user's files is refused, not emptied.

The signal tests run `python -m nnmem_sweep.cli report` in a subprocess. outputs.checkpoint (a no-op unless the
test hook's environment variable names a stage) holds the run at a known moment: "staged" (lock taken, staging
folder made), "tables" (grid run, before the CSVs), "html" (CSVs written, before the HTML), "pdf" (HTML written,
before the PDF), "commit" (run.json written, before the swap). One more test signals a run while weasyprint renders,
found by polling the staging folder, with no hook at all.
"""
from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from nnmem_sweep import outputs
from nnmem_sweep.cli import main
from nnmem_sweep.config import parse_scenario_text
from nnmem_sweep.outputs import PAUSE_ENV, RESUME_ENV, OutputSet, read_run_json
from nnmem_sweep.runner import run_scenario
from _helpers import sigint_default

ROOT = Path(__file__).resolve().parents[1]
EPOCH = "1767225600"  # 2026-01-01: the renders are byte-reproducible
# the old set: an inference scenario, so it has the serving plan's CSVs; the new one trains and has none
OLD = """\
name: tiny serving
model: {preset: gpt2}
mode: infer
grid: {batch: [1, 2], seq_len: 256, precision: bf16, cache_tokens: 0, decode_tokens: 16}
gpus: [t4]
"""
NEW = """\
name: tiny training
model: {preset: gpt2}
mode: train
grid: {batch: [1, 2], seq_len: 256, precision: bf16-mixed, optimizer: adamw}
gpus: [t4]
"""
OLD_FILES = ["max_batch.csv", "max_concurrency.csv", "max_context.csv", "report.html", "report.pdf",
             "results.csv", "run.json"]
NEW_FILES = ["max_batch.csv", "report.html", "report.pdf", "results.csv", "run.json"]


def cli(*args: str, pause: str | None = None, resume: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "SOURCE_DATE_EPOCH": EPOCH}
    env.pop(PAUSE_ENV, None)
    if pause:
        env[PAUSE_ENV], env[RESUME_ENV] = pause, str(resume or "/nonexistent")
    return subprocess.Popen([sys.executable, "-m", "nnmem_sweep.cli", *args, "-q"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_default)


def wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.1)
        if ready:
            line = proc.stderr.readline()
            if text in line:
                return
            assert line or proc.poll() is None, f"exited {proc.returncode} before {text!r}"
    raise AssertionError(f"no {text!r} within {timeout} s")


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def assert_complete_set(folder: Path, names: list[str]) -> dict:
    """Every file listed in run.json, with its size and sha256, and nothing else; one run id in the HTML too."""
    meta = read_run_json(folder)
    assert sorted(os.listdir(folder)) == names
    assert {f["name"]: (f["bytes"], f["sha256"]) for f in meta["files"]} == {
        n: (len(b), hashlib.sha256(b).hexdigest()) for n, b in files_of(folder).items() if n != "run.json"}
    assert f"<code>{meta['run_id']}</code>" in (folder / "report.html").read_text()
    return meta


def assert_no_leftovers(parent: Path) -> None:
    """Only the output folder beside it: no staging folder, no old set aside, no lock file."""
    assert sorted(os.listdir(parent)) == ["out"]


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("configs")
    (d / "old.yaml").write_text(OLD)
    (d / "new.yaml").write_text(NEW)
    return {"old": d / "old.yaml", "new": d / "new.yaml"}


@pytest.fixture(scope="module")
def old_set(configs, tmp_path_factory) -> Path:
    """A complete set written by a real `report` run, copied afresh into each test's folder."""
    out = tmp_path_factory.mktemp("old") / "out"
    proc = cli("report", str(configs["old"]), "--out", str(out))
    assert proc.wait(60) == 0, proc.stderr.read()
    assert_complete_set(out, OLD_FILES)
    return out


@pytest.fixture
def out(old_set, tmp_path) -> Path:
    target = tmp_path / "parent" / "out"
    shutil.copytree(old_set, target)
    return target


@pytest.mark.parametrize("command, stage, sig, code", [
    ("report", "staged", signal.SIGTERM, 143),  # lock taken, staging folder made
    ("report", "tables", signal.SIGINT, 130),  # before the CSVs
    ("report", "html", signal.SIGTERM, 143),  # CSVs written, before the HTML
    ("report", "pdf", signal.SIGINT, 130),  # HTML written, before the PDF
    ("run", "commit", signal.SIGTERM, 143),  # run.json written, before the swap (`run`: no PDF to wait for)
])
def test_a_signal_at_any_moment_keeps_the_complete_old_set(configs, out, command, stage, sig, code):
    before = files_of(out)
    proc = cli(command, str(configs["new"]), "--out", str(out), pause=stage)
    wait_for_line(proc, f"paused at {stage}")
    proc.send_signal(sig)
    assert proc.wait(30) == code
    last = proc.stderr.read().strip().splitlines()[-1]
    meta = json.loads(before["run.json"])
    what = "terminated (SIGTERM)" if sig == signal.SIGTERM else "interrupted (SIGINT)"
    assert last == (f"nnmem-sweep: {what}; {out} is unchanged: it holds the previous complete set "
                    f"(run {meta['run_id']}, finished {meta['finished_utc']})")
    assert files_of(out) == before
    assert_complete_set(out, OLD_FILES)
    assert_no_leftovers(out.parent)


def test_sigterm_while_weasyprint_renders_leaves_one_complete_set(configs, out):
    """No hook: the staging folder is polled until report.html is in it, and the run is stopped while the PDF
    renders. The folder is then the complete old set (or, had the PDF beaten the signal, the complete new one)."""
    before = files_of(out)
    proc = cli("report", str(configs["new"]), "--out", str(out))
    deadline = time.monotonic() + 60
    while not any((p / "report.html").exists() for p in out.parent.glob(".out.new-*")):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.002)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(30)
    if rc == 0:  # committed before the signal arrived
        assert_complete_set(out, NEW_FILES)
    else:
        assert rc == 143
        assert files_of(out) == before
    assert_no_leftovers(out.parent)


def test_a_second_run_into_a_busy_folder_refuses_and_the_first_replaces_the_set_whole(configs, out, tmp_path):
    """The first run holds the folder (paused before its HTML); a second is refused at once. The first then
    completes: max_concurrency.csv and max_context.csv belonged to the old scenario and do not survive beside the
    new set; run.json and the HTML name the same run id (the PDF is rendered from that HTML)."""
    old = read_run_json(out)
    resume = tmp_path / "resume"
    first = cli("report", str(configs["new"]), "--out", str(out), pause="html", resume=resume)
    wait_for_line(first, "paused at html")
    second = cli("run", str(configs["old"]), "--out", str(out))
    assert second.wait(30) == 2
    assert second.stderr.read().strip().splitlines() == [
        f"nnmem-sweep: {out} is being written by another nnmem-sweep run (pid {first.pid}; lock "
        f"{out.parent / '.out.lock'}); nothing written: run again when it has finished, or choose another --out"]
    resume.touch()
    assert first.wait(60) == 0
    printed = [Path(p).name for p in first.stdout.read().split()]
    assert printed == ["results.csv", "max_batch.csv", "report.html", "report.pdf", "run.json"]
    meta = assert_complete_set(out, NEW_FILES)
    assert meta["run_id"] != old["run_id"] and meta["command"] == "report"
    assert meta["config"]["sha256"] == hashlib.sha256(NEW.encode()).hexdigest()
    assert meta["run_id_covers"] == ["max_batch.csv", "results.csv"]
    assert_no_leftovers(out.parent)


def test_two_runs_started_together_never_mix(configs, tmp_path):
    """No hook: two `run`s into one folder at once. Each either writes its complete set or refuses; the folder is
    one complete set, and both printed what they wrote or why they did not."""
    out = tmp_path / "parent" / "out"
    procs = [cli("run", str(configs[k]), "--out", str(out)) for k in ("old", "new")]
    codes = [p.wait(60) for p in procs]
    assert sorted(set(codes)) in ([0], [0, 2])
    meta = read_run_json(out)
    assert sorted(os.listdir(out)) == sorted([f["name"] for f in meta["files"]] + ["run.json"])
    for f in meta["files"]:
        assert hashlib.sha256((out / f["name"]).read_bytes()).hexdigest() == f["sha256"]
    assert_no_leftovers(out.parent)


def test_a_folder_holding_a_users_file_is_refused_and_left_alone(configs, out, capsys):
    (out / "notes.txt").write_text("my notes")
    before = files_of(out)
    assert main(["run", str(configs["new"]), "--out", str(out), "-q"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"nnmem-sweep: refusing to replace {out}: it holds notes.txt, which no nnmem-sweep run wrote there; move "
        "them elsewhere or choose another --out (nothing written)"]
    assert files_of(out) == before
    assert_no_leftovers(out.parent)


def test_a_folder_from_before_run_json_is_replaced_with_its_stale_report(configs, tmp_path):
    out = tmp_path / "parent" / "out"
    out.mkdir(parents=True)
    # an earlier version's files, a temporary file one of its killed writes left, a file browser's litter
    for name in ("results.csv", "max_batch.csv", "report.html", "report.pdf", ".report.pdf.k2j3.tmp", ".DS_Store"):
        (out / name).write_text("written by an earlier version")
    assert main(["run", str(configs["new"]), "--out", str(out), "-q"]) == 0
    assert sorted(os.listdir(out)) == ["max_batch.csv", "results.csv", "run.json"]


def test_an_exception_while_rendering_keeps_the_old_set(configs, out, monkeypatch, capsys):
    from nnmem_sweep.report import pdfproc

    def broken(self, html):
        raise RuntimeError("weasyprint failed")

    monkeypatch.setattr(pdfproc.PdfProcess, "render", broken)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    before = files_of(out)
    with pytest.raises(RuntimeError, match="weasyprint failed") as caught:
        main(["report", str(configs["new"]), "--out", str(out), "-q"])
    assert caught.value.__notes__[0].startswith(f"{out} is unchanged: it holds the previous complete set")
    assert capsys.readouterr().err.strip() == f"nnmem-sweep: failed; {caught.value.__notes__[0]}"
    assert files_of(out) == before
    assert_no_leftovers(out.parent)


def test_what_a_killed_run_left_is_cleared_by_the_next(configs, out):
    """SIGKILL leaves the staging folder and the lock file (its lock died with the process); a crash between the
    fallback's two renames leaves no `out` and the old set aside. The next run puts the old set back first, then
    clears the rest."""
    old = files_of(out)
    os.rename(out, out.parent / ".out.old-crashed")
    (out.parent / ".out.new-crashed").mkdir()
    (out.parent / ".out.new-crashed" / "results.csv").write_text("half")
    (out.parent / ".out.lock").write_text("99999999\n")
    sc = parse_scenario_text(NEW)
    with pytest.raises(KeyError):
        with OutputSet(out, sc, command="run"):
            assert files_of(out) == old  # recovered before anything else
            raise KeyError("stop")
    assert files_of(out) == old
    assert_no_leftovers(out.parent)


def test_without_an_atomic_exchange_two_renames_leave_one_set(configs, out, monkeypatch):
    monkeypatch.setattr(outputs, "_exchange", lambda a, b: False)
    assert main(["run", str(configs["new"]), "--out", str(out), "-q", "--format", "parquet"]) == 0
    assert sorted(os.listdir(out)) == ["max_batch.parquet", "results.parquet", "run.json"]
    assert_no_leftovers(out.parent)


def test_a_link_to_a_folder_stays_a_link(configs, old_set, tmp_path):
    real = tmp_path / "disk" / "out"
    shutil.copytree(old_set, real)
    link = tmp_path / "parent" / "out"
    link.parent.mkdir()
    link.symlink_to(real)
    assert main(["run", str(configs["new"]), "--out", str(link), "-q"]) == 0
    assert link.is_symlink() and sorted(os.listdir(real)) == ["max_batch.csv", "results.csv", "run.json"]
    assert sorted(os.listdir(real.parent)) == ["out"]


def test_parquet_holds_the_same_frames_as_the_run(configs, tmp_path):
    out = tmp_path / "pq"
    assert main(["run", str(configs["new"]), "--out", str(out), "-q", "--format", "parquet"]) == 0
    res = run_scenario(parse_scenario_text(NEW))
    pd.testing.assert_frame_equal(pd.read_parquet(out / "results.parquet"), res.results)
    pd.testing.assert_frame_equal(pd.read_parquet(out / "max_batch.parquet"), res.max_batch)
    assert main(["run", str(configs["new"]), "--out", str(tmp_path / "st"), "-q", "--format", "parquet",
                 "--stream", "--chunk-rows", "1"]) == 0
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "st" / "results.parquet"), res.results)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "st" / "max_batch.parquet"), res.max_batch)
