"""The report's appendix sections built from data: "Formulas and sources" (the formulas registered in the code,
formulas.py) and "Validation" (accuracy.compare's measured vs estimated table)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from .format import DASH, gib_number, signed_percent


def formulas(all_formulas: list) -> list[dict[str, Any]]:
    """Every formula but the stated assumptions ('*.assumptions.*'), which the Assumptions section lists where they
    apply."""
    return [{"name": f.name, "expression": f.expression, "where": f.where, "module": f.module, "note": f.note,
             "sources": [{"key": s.key, "title": s.title, "ref": s.ref} for s in f.sources]} for f in all_formulas
            if ".assumptions." not in f.name]


# ---------------------------------------------------------------------------------------------------- validation
_VALIDATION_COLUMNS = (  # accuracy.compare's columns, as the report shows them
    ("case", "case"), ("measured_peak_bytes", "measured (GiB)"), ("estimated_peak_bytes", "estimated (GiB)"),
    ("error", "error"), ("measured_phase", "peak phase (measured)"), ("estimated_phase", "peak phase (estimated)"),
    ("attention_kernel", "attention kernel"), ("within_tolerance", "within tolerance"),
)


def _cell(col: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return DASH
    if col.endswith("_bytes"):
        return DASH if v < 0 else gib_number(v, 2)
    if col == "error" or col.endswith("_error"):
        return signed_percent(v)
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    return str(v)


def validation(table: pd.DataFrame | None) -> dict[str, Any] | None:
    """Measured vs estimated (accuracy.compare's frame): one row per case, GiB and signed relative error."""
    if table is None or len(table) == 0:
        return None
    cols = [(c, h) for c, h in _VALIDATION_COLUMNS if c in table.columns]
    rows = [[_cell(c, v) for (c, _), v in zip(cols, rec)]
            for rec in table[[c for c, _ in cols]].itertuples(index=False, name=None)]
    stats = ""
    if "error" in table.columns:
        err = table["error"].abs().dropna()
        err = err[np.isfinite(err)]
        if len(err):
            stats = (f"Median |error| {err.median() * 100:.1f}%, largest {err.max() * 100:.1f}% over {len(err)} "
                     f"cases the estimator could take")
            if "within_tolerance" in table.columns:
                stats += f"; {int(table['within_tolerance'].sum())} of {len(table)} within their stated tolerance"
            stats += "."
    return {"headers": [h for _, h in cols], "rows": rows, "count": str(len(rows)), "stats": stats}
