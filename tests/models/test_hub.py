"""Any Hugging Face id (issue 21): `preset: ORG/NAME` that is not a shipped preset reads config.json from the local
Hugging Face cache (a prepared folder here, no network), or from nnmem_sweep's own cache where a fetch kept it;
without either, and without the user's leave to fetch, one located line saying which file and how to get it."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from nnmem_sweep.config import parse_scenario_text
from nnmem_sweep.errors import ScenarioError
from nnmem_sweep.models import hub

TINY = json.loads((Path(__file__).parents[1] / "data" / "models" / "tiny-qwen3.json").read_text())
SCENARIO = ("model: {{preset: {id}}}\nmode: train\ngrid: {{batch: 1, seq_len: 128, precision: bf16, "
            "optimizer: adamw}}\ngpus: [h100-sxm]\n")


def _snapshot(root: Path, repo: str, rev: str, cfg: dict, main: bool = True) -> None:
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    snap = repo_dir / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(cfg))
    if main:
        (repo_dir / "refs").mkdir(exist_ok=True)
        (repo_dir / "refs" / "main").write_text(rev)


@pytest.fixture
def hf_cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.delenv(hub.NETWORK_ENV, raising=False)
    return root


def test_an_id_in_the_hugging_face_cache_is_its_config(hf_cache):
    _snapshot(hf_cache, "SomeOrg/Tiny-Qwen", "0123456789abcdef0123", TINY)
    sc = parse_scenario_text(SCENARIO.format(id="SomeOrg/Tiny-Qwen"), "s.yaml")
    assert sc.model.kind == "derived" and sc.model.derived.source.spec["hidden_size"] == 64
    assert sc.model.origin == "SomeOrg/Tiny-Qwen (Hugging Face cache, revision 0123456789ab)"


def test_refs_main_names_the_revision_else_the_newest_snapshot(hf_cache):
    _snapshot(hf_cache, "SomeOrg/Two", "aaaa", {**TINY, "hidden_size": 64})
    _snapshot(hf_cache, "SomeOrg/Two", "bbbb", {**TINY, "hidden_size": 128}, main=False)
    assert hub.config_path("SomeOrg/Two")[0].parent.name == "aaaa"  # refs/main, though bbbb is newer
    (hf_cache / "models--SomeOrg--Two" / "refs" / "main").unlink()
    later = time.time() + 10
    os.utime(hf_cache / "models--SomeOrg--Two" / "snapshots" / "bbbb" / "config.json", (later, later))
    assert hub.config_path("SomeOrg/Two")[0].parent.name == "bbbb"


def test_a_config_fetched_before_is_read_from_nnmem_sweeps_cache(hf_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("NNMEM_SWEEP_CACHE", str(tmp_path / "own"))
    own = tmp_path / "own" / "hub" / "SomeOrg--Kept" / "config.json"
    own.parent.mkdir(parents=True)
    own.write_text(json.dumps(TINY))
    path, origin = hub.config_path("SomeOrg/Kept")
    assert path == own and "fetched into" in origin


def test_without_the_file_or_leave_to_fetch_one_located_line(hf_cache):
    with pytest.raises(ScenarioError) as e:
        parse_scenario_text(SCENARIO.format(id="SomeOrg/Missing"), "s.yaml")
    (p,) = e.value.problems
    assert (p.key_path, p.line) == ("model.preset", 1)
    assert "not a shipped preset" in p.message and "huggingface-cli download SomeOrg/Missing config.json" in \
        p.message and f"{hub.NETWORK_ENV}=1" in p.message and str(hf_cache) in p.message


def test_a_name_that_is_no_id_keeps_the_preset_hint(hf_cache):
    with pytest.raises(ScenarioError) as e:
        parse_scenario_text(SCENARIO.format(id="llama-3.1-8bb"), "s.yaml")
    assert "did you mean llama-3.1-8b" in e.value.problems[0].message
