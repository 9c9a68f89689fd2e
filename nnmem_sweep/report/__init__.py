"""The capacity-planning report: report.html (self-contained), report.pdf, results.csv, max_batch.csv, run.json.

Flow, one direction: load_scenario -> run_scenario -> build_context (context.py and the section modules it gathers,
all arithmetic) -> render (render.py, jinja2 then weasyprint; the PDF in a child process, pdfproc.py). Charts are
hand-drawn SVG (charts.py); provenance.py says where it came from.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import hashlib

from .. import accuracy, formulas, published_compare
from ..allocator.snapshot import evidence as snapshot_evidence
from ..config import load_scenario
from ..diff import changes_since as diff_since, config_at_revision
from ..errors import Problem, ScenarioError
from ..gpu_compare import run_summaries
from ..grid import checked_size
from ..outputs import OutputSet, checkpoint
from ..paths import REPO_ROOT, atomic_write_bytes, atomic_write_text
from ..provenance import run_id as provenance_run_id
from ..runner import output_tables, run_scenario, write_tables
from ..tablefile import csv_bytes
from .context import build_context
from .pdfproc import PdfProcess
from .provenance import collect
from .render import render_html, render_pdf

AUTO = "auto"


class _Progress:
    def __init__(self, enabled: bool):
        self.enabled, self.t0 = enabled, time.perf_counter()

    def __call__(self, what: str) -> None:
        if self.enabled:
            print(f"nnmem-sweep report: {what} ({time.perf_counter() - self.t0:.1f} s)", file=sys.stderr, flush=True)


def load_formulas() -> list:
    """Every formula the code implements (formulas.py imports every module that registers one)."""
    return formulas.all_formulas()


def load_validation(truth_dir: Path | None = None, sharded: bool = False):
    """accuracy.compare over the committed measured cases (with `sharded`, the sharded steps': one rank of FSDP2,
    of DeepSpeed), or None when there are none (section omitted)."""
    folder = truth_dir or next((d for d in (Path("tests/data/truth"), REPO_ROOT / "tests/data/truth")
                                if d.is_dir()), None)
    if folder is None or not any(folder.glob("*.json")):
        return None
    cases = accuracy.load_cases(folder, sharded=sharded)
    return accuracy.compare(cases) if cases else None


def load_gpu_evidence(validation: Any = AUTO) -> dict[str, Any] | None:
    """What real GPUs say of the model, for the Validation section where it is left to its default: the allocator
    snapshots of real GPUs (tests/data/snapshots) replayed, and the committed GPU-kit runs (validation/gpu/)."""
    if not (isinstance(validation, str) and validation == AUTO):
        return None
    snaps = next((d for d in (Path("tests/data/snapshots"), REPO_ROOT / "tests/data/snapshots") if d.is_dir()), None)
    runs = next((d for d in (Path("validation/gpu"), REPO_ROOT / "validation/gpu") if d.parent.is_dir()), None)
    return {"snapshots": snapshot_evidence(snaps, _kept) if snaps else [],
            "gpu_runs": run_summaries(runs) if runs else None}


def _kept(path: Path, key: dict[str, str], compute) -> dict[str, Any]:  # noqa: ANN001 - snapshot.evidence_of
    """A recording's replay from the user cache under `key` (its sha256 and the allocator code's digest, from
    allocator.snapshot.evidence), computed and kept where it is not there: a recording the shipped evidence.json
    does not hold for this code is replayed once, not by every report."""
    import json

    from ..derive.cache import memo

    text = json.dumps(["snapshot evidence", key["sha256"], key["code"]])
    return memo("evidence", text, lambda: {"item": compute(path)})["item"]


def load_published_comparison(validation: Any = AUTO, published: Any = AUTO):
    """The published measurements against the estimator for the Validation section: published_compare's frame when
    both are left to their defaults, `published` as given otherwise (None: no such table)."""
    if isinstance(published, str) and published == AUTO:
        return published_compare.compare_published() \
            if isinstance(validation, str) and validation == AUTO else None
    return published


def templates_dir(sc) -> Path | None:
    """The user's template folder from `report.templates`, relative to the scenario file."""
    value = sc.report.get("templates")
    if not value:
        return None
    folder = Path(value)
    if not folder.is_absolute() and sc.path:
        folder = Path(sc.path).parent / folder
    if not folder.is_dir():
        raise ScenarioError([Problem(sc.path, None, None, "report.templates",
                                     f"template folder {str(folder)!r} does not exist")])
    return folder


def tables_run_id(result: Any, sha256: str) -> str:
    """The run id an output set of this result's tables gets (provenance.run_id over their CSV bytes), for a
    report rendered on its own, outside an output set."""
    return provenance_run_id(sha256, ((name, hashlib.sha256(csv_bytes(t)).hexdigest()) for name, t in output_tables(result)))


def render_report(result: Any, out_dir: Path, config_path: str | Path | None = None, *, progress: bool = False,
                  formulas: list | str = AUTO, validation: Any = AUTO, pdf: Any = True,
                  changes: Any = None, run_id: str | None = None, provenance: Any = None,
                  published: Any = AUTO) -> list[Path]:
    """Write report.html and report.pdf for a RunResult (scenario, results, max_batch).

    `formulas` and `validation` default to what the code registers and what tests/data/truth holds; tests pin them.
    `published` (published_compare's frame of published real-GPU measurements) defaults to tests/data/published's
    comparison where `validation` is left to its default, else to none.
    `changes` (a diff.Changes) adds the "Changes since REV" section. `run_id` and `provenance` come from the output
    set the report belongs to (make_report); on its own the report computes both (tables_run_id). `pdf`: False for
    the HTML only, True to render the PDF here, or a function HTML -> PDF bytes (make_report's pdfproc child).
    """
    say = progress if isinstance(progress, _Progress) else _Progress(progress)
    sc = result.scenario
    path = Path(config_path or sc.path)
    prov = provenance or collect(config_path or sc.path,
                                 sc.source_text.encode("utf-8") if not path.is_file() else None)
    auto = isinstance(validation, str) and validation == AUTO
    ctx = build_context(sc, result.results, result.max_batch, prov,
                        load_formulas() if formulas == AUTO else formulas,
                        load_validation() if auto else validation,
                        getattr(result, "serving", None), getattr(result, "serving_context", None), changes,
                        getattr(result, "cluster", None), load_published_comparison(validation, published),
                        load_gpu_evidence(validation),
                        # a layout's scenario: its recipes measured by a sharded step count, and the section says so
                        load_validation(sharded=True) if auto and sc.parallel else None)
    # the set's identity, beside the config's sha256 in the header (build_context leaves it to the writer)
    ctx["provenance"]["run_id"] = run_id or tables_run_id(result, prov.sha256)
    checkpoint("html")
    say("building HTML")
    html = render_html(ctx, templates_dir(sc))
    out_dir = Path(out_dir)
    written = [atomic_write_text(out_dir / "report.html", html)]
    if pdf:
        checkpoint("pdf")
        say("rendering PDF")
        written.append(atomic_write_bytes(out_dir / "report.pdf", pdf(html) if callable(pdf) else render_pdf(html)))
    return written


def make_report(config_path: str | Path, out_dir: Path, max_rows: int = 20_000_000,
                progress: bool = True, changes_since: str | None = None) -> list[Path]:
    """Run the scenario and write report.html, report.pdf, results.csv, max_batch.csv (and the plans the scenario
    has) with run.json into out_dir, as one set that replaces the previous one (outputs.OutputSet: the folder is
    locked and checked before the grid runs; an interruption leaves the previous set as it was).
    `changes_since` (a git revision) adds the max-batch cells that changed since CONFIG was as committed there;
    a revision that is not one, or a config that did not exist at it, fails before anything runs."""
    say = _Progress(progress)
    with PdfProcess() as pdf:  # first: weasyprint loads in the child while this process does the rest
        say(f"loading {config_path}")
        sc = load_scenario(config_path)
        old = None if changes_since is None else config_at_revision(config_path, changes_since)
        checked_size(sc, max_rows)
        with OutputSet(out_dir, sc, command="report", config_path=config_path) as out:
            say("running the grid")
            result = run_scenario(sc, max_rows=max_rows, progress=progress)
            changes = None
            if old is not None:
                say(f"running the grid as committed at {changes_since}")
                changes = diff_since(old, result.max_batch, max_rows=max_rows)
            checkpoint("tables")
            write_tables(result, out)
            render_report(result, out.folder, config_path, progress=say, changes=changes, run_id=out.run_id(),
                          provenance=out.provenance, pdf=pdf.render)
    say(f"wrote {', '.join(p.name for p in out.paths)} in {out.out} (run {out.run_id()})")
    return out.paths
