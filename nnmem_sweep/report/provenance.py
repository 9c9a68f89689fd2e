"""The report's provenance block comes from nnmem_sweep.provenance, which the output folder's run.json shares
(one config sha256, one commit, one run id in every file of a set)."""
from ..provenance import Provenance, collect, run_id

__all__ = ["Provenance", "collect", "run_id"]
