"""Shipped model presets: HF-style `config.json` files in models/presets/, one per id (`llama-3.1-8b.json`).

Each file is the model's published config plus an `_nnmem` key: {"name", "published_params", "params_source"}.
That key is ours; `hf_dict_for_transformers` strips it before the dict reaches transformers.
"""
from __future__ import annotations

import difflib
import json
from functools import lru_cache
from pathlib import Path

from .arch import Architecture

PRESET_DIR = Path(__file__).with_name("presets")
META_KEY = "_nnmem"


def preset_ids() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def preset_path(preset_id: str) -> Path:
    """The preset's config file; ValueError naming close matches (or every id) for an unknown id."""
    ids = preset_ids()
    if preset_id not in ids:
        close = difflib.get_close_matches(str(preset_id).lower(), ids, n=4, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else f"known presets: {', '.join(ids)}"
        raise ValueError(f"unknown model preset {preset_id!r}; {hint}")
    return PRESET_DIR / f"{preset_id}.json"


@lru_cache(maxsize=None)
def _raw(preset_id: str) -> str:
    return preset_path(preset_id).read_text(encoding="utf-8")


def preset_config(preset_id: str) -> dict:
    """The preset file as a dict, `_nnmem` key included (a fresh copy each call)."""
    return json.loads(_raw(preset_id))


def preset_meta(preset_id: str) -> dict:
    """{"name", "published_params", "params_source"} of a preset."""
    return dict(preset_config(preset_id)[META_KEY])


def hf_dict_for_transformers(preset_id: str) -> dict:
    """The config dict transformers accepts (`AutoConfig.for_model(**d)`): the preset minus our `_nnmem` key."""
    cfg = preset_config(preset_id)
    cfg.pop(META_KEY, None)
    return cfg


@lru_cache(maxsize=None)
def load_preset(preset_id: str) -> Architecture:
    from .hf import architecture_from_hf

    path = preset_path(preset_id)
    return architecture_from_hf(preset_config(preset_id), origin=f"preset {path.name}", preset=preset_id)


def list_presets() -> list[Architecture]:
    """Every shipped preset, sorted by id."""
    return [load_preset(i) for i in preset_ids()]
