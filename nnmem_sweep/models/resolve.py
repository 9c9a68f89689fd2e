"""The scenario's `model:` mapping -> Architecture. Exactly one form:

    {preset: llama-3.1-8b}
    {hf_config: relative/path/config.json}          (relative to the scenario file)
    {architecture: {family: llama, hidden: 4096, ...}}
    {params: 20000000, activation_elements_per_sample: 1000000}   (or _per_token, or layers+hidden+multiplier)
    {input_shape: [3, 32, 32], layers: [{type: conv2d, ...}, ...]}

plus an optional `name` that overrides the display name. Errors carry the key path, so the config loader can
point at file:line.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ._errors import FieldError
from .arch import Architecture

FORMS = ("preset", "hf_config", "architecture", "params", "layers")


class ModelSpecError(ValueError):
    """A problem in the `model:` mapping; `key_path` is dotted from the document root, e.g. "model.layers[3].kernel_size"."""

    def __init__(self, key_path: str, message: str):
        self.key_path = key_path
        self.message = message
        super().__init__(f"{key_path}: {message}")


def _form(spec: dict[str, Any]) -> str:
    found = [k for k in ("preset", "hf_config", "architecture", "params") if k in spec]
    if "input_shape" in spec:
        found.append("layers")
    elif "layers" in spec and isinstance(spec["layers"], list):
        found.append("layers")  # a layer list without input_shape: reported below as the missing key
    if len(found) != 1:
        got = f"got {', '.join(found)}" if found else "got none"
        raise ModelSpecError("model", "give exactly one of preset, hf_config, architecture, params, or "
                                      f"input_shape + layers; {got}")
    return found[0]


def _only(spec: dict[str, Any], allowed: tuple[str, ...]) -> None:
    for key in spec:
        if key not in allowed:
            raise ModelSpecError(f"model.{key}", f"not allowed here; this model form takes {', '.join(allowed)}")


def resolve_model(spec: dict, base_dir: Path) -> Architecture:
    if not isinstance(spec, dict):
        raise ModelSpecError("model", f"must be a mapping, got {type(spec).__name__}")
    name = spec.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ModelSpecError("model.name", f"must be a non-empty string, got {name!r}")
    form = _form(spec)
    try:
        arch = _resolve(form, spec, Path(base_dir))
    except FieldError as e:
        prefix = {"architecture": "model.architecture", "layers": "model"}.get(form, "model")
        raise ModelSpecError(f"{prefix}.{e.key}" if e.key else prefix, e.message) from None
    if name:
        arch = dataclasses.replace(arch, name=name.strip())
    return arch


def _resolve(form: str, spec: dict[str, Any], base_dir: Path) -> Architecture:
    if form == "preset":
        _only(spec, ("preset", "name"))
        from .presets import load_preset

        if not isinstance(spec["preset"], str):
            raise ModelSpecError("model.preset", f"must be a preset id, got {spec['preset']!r}")
        try:
            return load_preset(spec["preset"])
        except ValueError as e:
            raise ModelSpecError("model.preset", str(e)) from None
    if form == "hf_config":
        _only(spec, ("hf_config", "name"))
        return _from_hf_file(spec["hf_config"], base_dir)
    if form == "architecture":
        _only(spec, ("architecture", "name"))
        from .explicit import architecture_from_fields

        return architecture_from_fields(spec["architecture"], origin="explicit architecture")
    if form == "params":
        from .explicit import architecture_from_params

        return architecture_from_params(spec, origin="explicit params")
    _only(spec, ("input_shape", "layers", "name"))
    from .layers import architecture_from_layers

    if "input_shape" not in spec:
        raise ModelSpecError("model.input_shape", "missing: a layer list needs the per-sample input shape")
    if "layers" not in spec:
        raise ModelSpecError("model.layers", "missing: input_shape needs a layer list")
    return architecture_from_layers(spec["input_shape"], spec["layers"], origin="layer list")


def _from_hf_file(rel: Any, base_dir: Path) -> Architecture:
    from .hf import architecture_from_hf

    key = "model.hf_config"
    if not isinstance(rel, str) or not rel:
        raise ModelSpecError(key, f"must be a path to a config.json, got {rel!r}")
    path = Path(rel) if Path(rel).is_absolute() else base_dir / rel
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelSpecError(key, f"file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelSpecError(key, f"cannot read {path}: {e.__class__.__name__}: {e}") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelSpecError(key, f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    try:
        return architecture_from_hf(cfg, origin=str(rel))
    except ValueError as e:
        raise ModelSpecError(key, f"{path}: {e}") from None
