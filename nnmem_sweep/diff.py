"""Which max-batch cells changed between two runs of a scenario (two files, or one file at a git revision).

`diff_max_batch(old, new)` compares the max_batch tables cell by cell: a cell is one combination of the non-batch
axes and GPU (columns.NON_BATCH_AXES + gpu), and of the parallel axes (columns.PARALLEL_AXES) when either table
has them (`key_columns`). A table without them (a scenario before it gained a `parallel:` block) is the one-GPU
layout, every parallel axis at its default (columns.PARALLEL_DEFAULTS: the estimator gives that layout exactly
the single-GPU figures), so its cells meet the new table's one-GPU layout and every other layout is "added".
The answer is ordered by what a reviewer must see first:

    fits -> does not fit   (max_batch was >= 1, is now 0)
    decrease               (largest drop first)
    does not fit -> fits   (max_batch was 0, is now >= 1)
    increase               (largest gain first)
    added, removed         (the cell exists on one side only)

`provenance(config)` says whether CONFIG is committed as it is on disk (for the report's provenance line).

`scenario_at_revision(config, rev)` reads CONFIG as it was at REV with `git show REV:./file`, run in the folder
holding CONFIG, so the path is taken relative to the repository that contains it. `config_at_revision` also names
the commit REV resolves to and the file's sha256 there, and `changes_since` diffs that against a run of today's
file: what `nnmem-sweep report CONFIG --changes-since REV` shows.
"""
from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from . import columns as C
from .config import parse_scenario_text
from .errors import UsageError
from .fit import MAX_BATCH_CAP
from .grid import MAX_ROWS
from .runner import run_scenario
from .scenario import Scenario

KEY = C.NON_BATCH_AXES + (C.GPU,)
OLD, NEW, DELTA, CHANGE = "old_max_batch", "new_max_batch", "delta", "change"
FITS_TO_NOT = "fits -> does not fit"
DECREASE = "decrease"
NOT_TO_FITS = "does not fit -> fits"
INCREASE = "increase"
ADDED = "added"
REMOVED = "removed"
ORDER = (FITS_TO_NOT, DECREASE, NOT_TO_FITS, INCREASE, ADDED, REMOVED)


def _frame(mb) -> pd.DataFrame:
    return mb if isinstance(mb, pd.DataFrame) else mb.max_batch  # a RunResult


def key_columns(*frames: pd.DataFrame) -> list[str]:
    """A cell's key: the non-batch axes and GPU, the optional axes any of `frames` has (columns.OPTIONAL_AXES),
    then the parallel axes when any of them has one of those."""
    optional = [a for a in C.OPTIONAL_AXES if any(a in f.columns for f in frames)]
    parallel = any(a in f.columns for f in frames for a in C.PARALLEL_AXES)
    return [*KEY, *optional, *(C.PARALLEL_AXES if parallel else ())]


def _table(mb: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """Key columns as plain strings/ints (categoricals of two runs never share categories) and max_batch; a
    parallel or optional axis the table lacks holds its default (the one-GPU layout; set_to_none)."""
    n = len(mb)
    defaults = {**C.PARALLEL_DEFAULTS, **C.OPTIONAL_DEFAULTS}
    cols = {k: mb[k] if k in mb.columns else pd.Series([defaults[k]] * n, index=mb.index) for k in key}
    out = {k: (v.astype(str) if not pd.api.types.is_integer_dtype(v) else v.astype(np.int64))
           for k, v in cols.items()}
    out[C.MAX_BATCH] = mb[C.MAX_BATCH].astype(np.int64)
    return pd.DataFrame(out)


def diff_max_batch(old, new) -> pd.DataFrame:
    """The changed cells between two max_batch tables (or RunResults): the key columns (key_columns: with the
    parallel axes when either side has them), old_max_batch, new_max_batch (nullable Int64; <NA> on the missing
    side), delta (new − old) and change, ordered as in the module docstring. Unchanged cells are left out; an empty
    frame means nothing changed."""
    old, new = _frame(old), _frame(new)
    key = key_columns(old, new)
    a, b = _table(old, key), _table(new, key)
    m = a.merge(b, on=key, how="outer", suffixes=("_old", "_new"), indicator=True, sort=False)
    o = m[f"{C.MAX_BATCH}_old"].astype("Int64")
    n = m[f"{C.MAX_BATCH}_new"].astype("Int64")
    both = (m["_merge"] == "both").to_numpy()
    ov = o.fillna(0).to_numpy(dtype=np.int64)
    nv = n.fillna(0).to_numpy(dtype=np.int64)
    change = np.select(
        [~both & (m["_merge"] == "right_only").to_numpy(), ~both,
         (ov > 0) & (nv == 0), nv < ov, (ov == 0) & (nv > 0), nv > ov],
        [ADDED, REMOVED, FITS_TO_NOT, DECREASE, NOT_TO_FITS, INCREASE], default="")
    out = m[key].copy()
    out[OLD] = o
    out[NEW] = n
    out[DELTA] = (n - o).astype("Int64")
    out[CHANGE] = change
    out = out[out[CHANGE] != ""]
    rank = pd.Series({c: i for i, c in enumerate(ORDER)})
    # within a group: the largest drop or gain first; ties keep the old table's row order (stable sort)
    size = out[DELTA].abs().fillna(0).to_numpy(dtype=np.int64)
    out = out.assign(_r=rank[out[CHANGE]].to_numpy(), _s=-size).sort_values(["_r", "_s"], kind="stable")
    out[CHANGE] = pd.Categorical(out[CHANGE], categories=list(ORDER))
    return out.drop(columns=["_r", "_s"]).reset_index(drop=True)


def _show(v) -> str:
    if v is pd.NA:
        return "-"
    return "unbounded" if int(v) >= MAX_BATCH_CAP else str(int(v))


def format_diff(d: pd.DataFrame, old_label: str, new_label: str) -> str:
    """Text for `nnmem-sweep diff`: one line per changed cell, grouped by kind of change. Only the axes that
    vary somewhere in the diff are printed, plus gpu."""
    if d.empty:
        return f"max batch: no cell changed between {old_label} and {new_label}"
    shown = [k for k in key_columns(d) if k == C.GPU or d[k].nunique(dropna=False) > 1]
    head = "  ".join(shown)
    lines = [f"max batch: {len(d):,} cell(s) changed, {old_label} -> {new_label}"]
    for kind in ORDER:
        part = d[d[CHANGE] == kind]
        if part.empty:
            continue
        lines.append(f"{kind} ({len(part):,}):  [{head}]")
        keys = part[shown].astype(str).agg("  ".join, axis=1).tolist()
        for key, o, n in zip(keys, part[OLD], part[NEW]):
            lines.append(f"  {key}: {_show(o)} -> {_show(n)}")
    return "\n".join(lines)


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", *args], cwd=folder, capture_output=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None


@dataclass(frozen=True)
class Provenance:
    commit: str | None  # HEAD of the repository holding the config; None outside git
    state: str  # "committed" | "uncommitted changes" | "not tracked by git" | "not in a git repository"

    @property
    def dirty(self) -> bool:
        return self.state != "committed"


def provenance(config: str | Path) -> Provenance:
    """Is CONFIG in git exactly as it is on disk? Never raises: outside git it says so."""
    p = Path(config)
    folder = p.parent if str(p.parent) else Path(".")
    head = _git(folder, "rev-parse", "--verify", "-q", "HEAD") if folder.is_dir() else None
    if head is None or head.returncode != 0:
        return Provenance(None, "not in a git repository")
    commit = head.stdout.decode().strip()
    st = _git(folder, "status", "--porcelain", "--", p.name)
    text = st.stdout.decode("utf-8", "replace") if st is not None and st.returncode == 0 else "??"
    if not text.strip():
        return Provenance(commit, "committed")
    return Provenance(commit, "not tracked by git" if text.startswith("??") else "uncommitted changes")


@dataclass(frozen=True)
class AtRevision:
    """CONFIG as committed at a revision: what `report --changes-since REV` compares the working tree with."""
    rev: str  # as the user gave it
    commit: str  # the full hash REV resolves to
    sha256: str  # of the file's bytes at that commit
    scenario: Scenario


def _folder(config: str | Path) -> Path:
    p = Path(config)
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{config}: no such folder {str(folder)!r}")
    return folder


def _checked(rev: str, option: str) -> str:
    if rev.startswith("-"):
        raise UsageError(f"{option} {rev!r}: a revision cannot start with '-'")
    return rev


def _bytes_at_revision(config: str | Path, rev: str, what: str | None = None) -> bytes:
    """`git show REV:./file` run in CONFIG's folder; errors start with `what` (default: cannot read ... at REV)."""
    what = what or f"cannot read {config} at revision {rev!r}"
    done = _git(_folder(config), "show", f"{rev}:./{Path(config).name}")
    if done is None:
        raise UsageError(f"{what}: git is not installed or did not answer")
    if done.returncode != 0:
        msg = done.stderr.decode("utf-8", "replace").strip().splitlines()
        why = msg[-1].removeprefix("fatal: ") if msg else f"git exit {done.returncode}"
        raise UsageError(f"{what}: {why}")
    return done.stdout


def _text(data: bytes, config: str | Path, rev: str) -> str:
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise UsageError(f"{config} at revision {rev!r} is not UTF-8 text") from None


def scenario_text_at_revision(config: str | Path, rev: str, option: str = "--against") -> str:
    """The text of CONFIG at git revision REV; UsageError (one line) when git, the repository, the revision or
    the file at that revision is missing. `option` names the flag REV came from in the messages."""
    _checked(rev, option)
    return _text(_bytes_at_revision(config, rev), config, rev)


def _parse(text: str, config: str | Path, rev: str) -> Scenario:
    return parse_scenario_text(text, file=f"{rev}:{config}", base_dir=Path(config).parent)


def scenario_at_revision(config: str | Path, rev: str) -> Scenario:
    """CONFIG as it was at REV, validated; relative paths inside it resolve from CONFIG's folder today."""
    return _parse(scenario_text_at_revision(config, rev), config, rev)


def config_at_revision(config: str | Path, rev: str, option: str = "--changes-since") -> AtRevision:
    """CONFIG at REV with the commit REV names and the sha256 of the file there; one-line UsageError when REV is
    not a commit of the repository holding CONFIG or the file did not exist at it."""
    _checked(rev, option)
    done = _git(_folder(config), "rev-parse", "--verify", "-q", f"{rev}^{{commit}}")
    if done is None:
        raise UsageError(f"{option} {rev}: git is not installed or did not answer")
    if done.returncode != 0:
        inside = _git(_folder(config), "rev-parse", "--is-inside-work-tree")
        if inside is None or inside.returncode != 0:
            raise UsageError(f"{option} {rev}: {config} is not in a git repository")
        raise UsageError(f"{option} {rev}: not a commit of the git repository holding {config}")
    commit = done.stdout.decode().strip()
    data = _bytes_at_revision(config, commit, f"{option} {rev}: cannot read {config} at commit {commit[:12]}")
    return AtRevision(rev, commit, hashlib.sha256(data).hexdigest(), _parse(_text(data, config, rev), config, rev))


@dataclass(frozen=True)
class Changes:
    """The max-batch cells that changed since a revision (the report's "Changes since REV" section)."""
    old: AtRevision
    cells: pd.DataFrame  # diff_max_batch(CONFIG at the revision, CONFIG now); empty when nothing changed


def changes_since(old: AtRevision, new_max_batch: pd.DataFrame, max_rows: int = MAX_ROWS) -> Changes:
    """Run CONFIG as it was at the revision and compare its max-batch table with `new_max_batch` (the run now)."""
    return Changes(old, diff_max_batch(run_scenario(old.scenario, max_rows=max_rows), new_max_batch))


def diff_scenarios(old: Scenario, new: Scenario, max_rows: int = MAX_ROWS) -> pd.DataFrame:
    return diff_max_batch(run_scenario(old, max_rows=max_rows), run_scenario(new, max_rows=max_rows))
