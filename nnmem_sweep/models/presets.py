"""Shipped model presets: HF-style `config.json` files in models/presets/, one per id (`llama-3.1-8b.json`).

Each file is the model's published config plus an `_nnmem` key, ours (`hf_dict_for_transformers` strips it before
the dict reaches transformers):
  name                display name
  hf_id               the Hugging Face repository id, accepted wherever a preset id is ("meta-llama/Llama-3.1-8B")
  published_params    the published parameter count, with params_source naming where it was read
  published_rounding  (optional) the precision of a published figure given rounded ("15.5B": 100,000,000)
  published_includes  (optional) {part: parameters} the published figure counts that the preset does not build
                      (a vision tower beside the text model)
A preset is hand-modelled when models/hf.py has a reader for its model_type (`hand_modelled`); the others are
planned from the model's own code (the derive package) and `load_preset` refuses them with that reason.
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


@lru_cache(maxsize=None)
def _by_hf_id() -> dict[str, str]:
    """Lower-cased Hugging Face id -> preset id (the Hub treats repository ids case-insensitively)."""
    out = {}
    for pid in preset_ids():
        hf_id = json.loads((PRESET_DIR / f"{pid}.json").read_text(encoding="utf-8"))[META_KEY].get("hf_id")
        if hf_id:
            out[hf_id.lower()] = pid
    return out


def canonical_id(name: str) -> str:
    """The preset id of `name`, a preset id or a Hugging Face id; ValueError naming close matches (or every id)
    for an unknown name."""
    ids = preset_ids()
    if name in ids:
        return name
    by_hf = _by_hf_id()
    key = str(name).lower()
    if key in by_hf:
        return by_hf[key]
    close = difflib.get_close_matches(key, ids, n=4, cutoff=0.6) or \
        [by_hf[k] for k in difflib.get_close_matches(key, list(by_hf), n=4, cutoff=0.8)]
    hint = f"did you mean {', '.join(close)}?" if close else f"known presets: {', '.join(ids)}"
    raise ValueError(f"unknown model preset {name!r}; {hint}")


def preset_path(preset_id: str) -> Path:
    """The preset's config file, by preset id or Hugging Face id; ValueError naming close matches (or every id) for
    an unknown name."""
    return PRESET_DIR / f"{canonical_id(preset_id)}.json"


@lru_cache(maxsize=None)
def _raw(preset_id: str) -> str:
    return preset_path(preset_id).read_text(encoding="utf-8")  # by preset id or HF id


def preset_config(preset_id: str) -> dict:
    """The preset file as a dict, `_nnmem` key included (a fresh copy each call)."""
    return json.loads(_raw(preset_id))


def preset_meta(preset_id: str) -> dict:
    """The preset's `_nnmem` dict: name, hf_id, published_params, params_source (and the optional keys)."""
    return dict(preset_config(preset_id)[META_KEY])


def hf_dict_for_transformers(preset_id: str) -> dict:
    """The config dict transformers accepts (`AutoConfig.for_model(**d)`): the preset minus our `_nnmem` key."""
    cfg = preset_config(preset_id)
    cfg.pop(META_KEY, None)
    return cfg


def hand_modelled(preset_id: str) -> bool:
    """True when models/hf.py reads the preset's model_type into an Architecture (the estimator's own formulas);
    False for the families that are planned from the model's own code (the derive package, needs [measure])."""
    from .hf import supported_model_types

    return preset_config(preset_id).get("model_type") in supported_model_types()


def hand_modelled_ids() -> list[str]:
    return [i for i in preset_ids() if hand_modelled(i)]


def built_params_expected(preset_id: str) -> int:
    """What the preset's model must count, from its published figure: the figure less the parts it counts that the
    preset does not build (`published_includes`)."""
    meta = preset_meta(preset_id)
    return int(meta["published_params"]) - sum(int(v) for v in (meta.get("published_includes") or {}).values())


@lru_cache(maxsize=None)
def load_preset(preset_id: str) -> Architecture:
    """The preset's Architecture, by preset id or Hugging Face id. ValueError for an unknown name, and for a preset
    whose family has no hand reader (see `hand_modelled`)."""
    from .hf import architecture_from_hf

    pid = canonical_id(preset_id)
    if not hand_modelled(pid):
        cfg = preset_config(pid)
        raise ValueError(f"preset {pid!r} ({cfg[META_KEY]['name']}, model_type {cfg.get('model_type')!r}) has no "
                         "hand-modelled reader: it is planned from the model's own code (derived; needs the "
                         "[measure] extra)")
    path = preset_path(pid)
    return architecture_from_hf(preset_config(pid), origin=f"preset {path.name}", preset=pid)


def list_presets() -> list[Architecture]:
    """Every hand-modelled preset, sorted by id (`hand_modelled_ids`; the derived ones have no Architecture here)."""
    return [load_preset(i) for i in hand_modelled_ids()]
