"""Model descriptions: presets (HF config.json files), the HF config reader, explicit fields, layer-list nets.

Importing the package registers the parameter-count formulas (count.py, layers.py) with `citations`, so the
report's "Formulas and sources" section lists them wherever an Architecture is used.
"""
from __future__ import annotations

from . import count, layers  # noqa: F401  (register formulas)
from .arch import Architecture, LayerRecord
from .presets import hf_dict_for_transformers, list_presets, load_preset, preset_ids
from .resolve import ModelSpecError, resolve_model

__all__ = ["Architecture", "LayerRecord", "ModelSpecError", "hf_dict_for_transformers", "list_presets",
           "load_preset", "preset_ids", "resolve_model"]
