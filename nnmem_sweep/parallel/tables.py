"""Per-(precision, layout) byte counts as plan arrays: what parallel/plan.py and recomputed.py add to their phases."""
from __future__ import annotations

import numpy as np

from ..components.plan import consts, lift


def layout_tables(fn, precs, layouts, sizes: tuple, dims: tuple) -> list[np.ndarray] | None:
    """fn(precision, layout) -> a tuple of byte counts, as one plan array per element over every (precision,
    layout) at plan dimensions `dims`; None where every count is zero (the phases need nothing added)."""
    rows = [tuple(fn(p, lay)) for p in precs for lay in layouts]
    if not any(any(r) for r in rows):
        return None
    shape = (len(precs), len(layouts))
    return [lift(consts([r[k] for r in rows], shape), dims, sizes) for k in range(len(rows[0]))]
