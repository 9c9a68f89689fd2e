"""The report's "Changes since REV" section (`nnmem-sweep report CONFIG --changes-since REV`): the max-batch cells
that changed between CONFIG as committed at REV and CONFIG now, in diff.diff_max_batch's order (fits -> does not
fit first), both sides named by commit and sha256. Formatted here; templates/_changes.html.j2 lays it out."""
from __future__ import annotations

from typing import Any

import pandas as pd

from .. import columns as C
from ..diff import CHANGE, FITS_TO_NOT, NEW, OLD, ORDER, Changes, key_columns
from ..fit import MAX_BATCH_CAP
from ..scenario import Scenario
from .format import AXIS_LABELS, DASH, axis_value
from .provenance import Provenance

MAX_ROWS = 100  # cells listed; the rest are counted (`nnmem-sweep diff CONFIG --against REV` lists them all)
ABSENT = "not in the grid"


def _max_batch(v: Any) -> str:
    if v is pd.NA:
        return ABSENT
    v = int(v)
    return DASH if v == 0 else "unbounded" if v >= MAX_BATCH_CAP else f"{v:,}"


def _title(kind: str) -> str:
    return kind.replace("->", "→")


def section(changes: Changes | None, prov: Provenance, sc: Scenario) -> dict[str, Any] | None:
    """None without --changes-since (no section). The changed cells grouped by kind of change, in diff's order;
    only the axes that vary among them are shown, and GPU names instead of ids."""
    if changes is None:
        return None
    d = changes.cells
    old = changes.old
    names = {g.id: g.name for g in (*old.scenario.gpus, *sc.gpus)}  # today's name where both have the GPU
    shown = [k for k in key_columns(d) if k == C.GPU or d[k].nunique(dropna=False) > 1]  # parallel axes too
    listed = d.head(MAX_ROWS)
    groups = []
    for kind in ORDER:
        part = listed[listed[CHANGE] == kind]
        if part.empty:
            continue
        rows = [{"axes": [names.get(v, str(v)) if a == C.GPU else axis_value(a, v) for a, v in zip(shown, rec[:-2])],
                 "old": _max_batch(rec[-2]), "new": _max_batch(rec[-1])}
                for rec in part[[*shown, OLD, NEW]].itertuples(index=False, name=None)]
        total = int((d[CHANGE] == kind).sum())
        groups.append({"title": _title(kind), "count": f"{total:,}", "nofit": kind == FITS_TO_NOT,
                       "rows": rows, "more": f"{total - len(rows):,}" if total > len(rows) else ""})
    state = "" if not prov.dirty else (" (uncommitted changes)" if prov.in_git else " (not committed)")
    return {
        "rev": old.rev,
        "old": {"commit": old.commit, "sha256": old.sha256},
        "new": {"commit": prov.commit, "sha256": prov.sha256, "state": state},
        "headers": [AXIS_LABELS.get(a, a) for a in shown],
        "groups": groups,
        "count": f"{len(d):,}",
        "counts": ", ".join(f"{n:,} {_title(k)}" for k, n in d[CHANGE].value_counts(sort=False).items() if n),
        "truncated": len(d) > len(listed),
        "listed": f"{len(listed):,}",
    }
