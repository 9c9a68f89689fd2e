"""The derived-plan cache (derive/cache.py) under NNMEM_SWEEP_REDERIVE=1: every document is made anew, once per
process. `make derive` looked one plan up several times while deriving a scenario (its estimate, its replays) and
traced it again at each lookup: the Llama 2 70B QLoRA scenario's three sharded plans were traced five times over."""
from __future__ import annotations

from nnmem_sweep.derive import cache


def test_rederive_makes_each_document_once_per_process(tmp_path, monkeypatch):
    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "_REDERIVED", set())
    made = []

    def make():
        made.append(1)
        return {"n": len(made)}

    digest, what = "0" * 64, ("train", "bf16")
    first = cache.lookup(digest, what, make)  # stored in the user cache
    monkeypatch.setattr(cache, "_REDERIVED", set())  # by an earlier process
    monkeypatch.setenv("NNMEM_SWEEP_REDERIVE", "1")
    again = cache.lookup(digest, what, make)  # made anew, though stored
    assert (first["n"], again["n"], len(made)) == (1, 2, 2)
    assert cache.lookup(digest, what, make)["n"] == 2 and len(made) == 2  # not a third time in this process
    assert cache.stored(digest, what)
    assert cache.lookup(digest, ("train", "fp32"), make)["n"] == 3  # another document is made anew
    monkeypatch.setattr(cache, "_REDERIVED", set())  # a new process: anew again
    assert not cache.stored(digest, what)
    assert cache.lookup(digest, what, make)["n"] == 4
