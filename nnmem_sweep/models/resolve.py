"""The scenario's `model:` mapping -> Architecture. Exactly one form:

    {preset: llama-3.1-8b}
    {hf_config: relative/path/config.json}          (relative to the scenario file)
    {architecture: {family: llama, hidden: 4096, ...}}
    {params: 20000000, activation_elements_per_sample: 1000000}   (or _per_token, or layers+hidden+multiplier)
    {input_shape: [3, 32, 32], layers: [{type: conv2d, ...}, ...]}
    {module: "torchvision.models:resnet50", kwargs: {num_classes: 1000}, input_shape: [3, 224, 224]}

plus an optional `name` that overrides the display name, and for presets and hf_config an optional `derive: true`.
Errors carry the key path, so the config loader can point at file:line.

Models of families without a hand model (a preset or config.json whose model_type models/hf.py has no reader, any
`module:` factory, or `derive: true`) are planned from their own code (derive/): resolve_model returns a
DerivedModelSpec for them, which the caller turns into an Architecture (derive/arch.py; it may build the model).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import FieldError
from .arch import Architecture

FORMS = ("preset", "hf_config", "architecture", "params", "layers", "module")


@dataclass(frozen=True)
class DerivedModelSpec:
    """A model to plan from its own code: kind "hf" (spec: the config.json dict) or "module" (spec: module, kwargs,
    input_shape, num_classes). key_path: where a problem building it is reported (model.preset, ...)."""

    kind: str
    spec: dict
    name: str
    preset: str
    origin: str
    key_path: str
    decoder_seq_len: int = 0  # encoder-decoders: the decoder's length when it is not the encoder's


class ModelSpecError(ValueError):
    """A problem in the `model:` mapping; `key_path` is dotted from the document root, e.g. "model.layers[3].kernel_size"."""

    def __init__(self, key_path: str, message: str):
        self.key_path = key_path
        self.message = message
        super().__init__(f"{key_path}: {message}")


def _form(spec: dict[str, Any]) -> str:
    found = [k for k in ("preset", "hf_config", "architecture", "params", "module") if k in spec]
    if "input_shape" in spec and "module" not in spec:
        found.append("layers")
    elif "layers" in spec and isinstance(spec["layers"], list):
        found.append("layers")  # a layer list without input_shape: reported below as the missing key
    if len(found) != 1:
        got = f"got {', '.join(found)}" if found else "got none"
        raise ModelSpecError("model", "give exactly one of preset, hf_config, architecture, params, module, or "
                                      f"input_shape + layers; {got}")
    return found[0]


def _only(spec: dict[str, Any], allowed: tuple[str, ...]) -> None:
    for key in spec:
        if key not in allowed:
            raise ModelSpecError(f"model.{key}", f"not allowed here; this model form takes {', '.join(allowed)}")


def resolve_model(spec: dict, base_dir: Path) -> Architecture | DerivedModelSpec:
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
    if isinstance(arch, DerivedModelSpec):
        return dataclasses.replace(arch, name=name.strip()) if name else arch
    if name:
        arch = dataclasses.replace(arch, name=name.strip())
    return arch


def _decoder_len(spec: dict[str, Any]) -> int:
    value = spec.get("decoder_seq_len", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelSpecError("model.decoder_seq_len", f"must be a positive integer (an encoder-decoder's decoder "
                                                      f"length), got {value!r}")
    return value


def _derive_flag(spec: dict[str, Any]) -> bool:
    value = spec.get("derive", False)
    if not isinstance(value, bool):
        raise ModelSpecError("model.derive", f"must be true or false, got {value!r}")
    return value


def _resolve(form: str, spec: dict[str, Any], base_dir: Path) -> Architecture | DerivedModelSpec:
    if form == "preset":
        _only(spec, ("preset", "name", "derive", "decoder_seq_len"))
        from . import hub
        from .presets import META_KEY, canonical_id, hand_modelled, hf_dict_for_transformers, load_preset, preset_meta

        if not isinstance(spec["preset"], str):
            raise ModelSpecError("model.preset", f"must be a preset id, got {spec['preset']!r}")
        try:
            try:
                pid = canonical_id(spec["preset"])
            except ValueError:
                if not hub.looks_like_id(spec["preset"]):
                    raise
                # a Hugging Face id that is not a preset: its config.json from the local caches (models/hub.py)
                path, origin = hub.config_path(spec["preset"])
                arch = _from_hf_file(str(path), base_dir, _derive_flag(spec) or bool(_decoder_len(spec)),
                                     key="model.preset", origin=origin)
                return dataclasses.replace(arch, decoder_seq_len=_decoder_len(spec)) \
                    if isinstance(arch, DerivedModelSpec) else arch
            if _derive_flag(spec) or not hand_modelled(pid):
                cfg = hf_dict_for_transformers(pid)
                cfg.pop(META_KEY, None)
                return DerivedModelSpec("hf", cfg, preset_meta(pid)["name"], pid, f"preset {pid}.json",
                                        "model.preset", _decoder_len(spec))
            return load_preset(pid)
        except ValueError as e:
            raise ModelSpecError("model.preset", str(e)) from None
    if form == "hf_config":
        _only(spec, ("hf_config", "name", "derive", "decoder_seq_len"))
        arch = _from_hf_file(spec["hf_config"], base_dir, _derive_flag(spec) or bool(_decoder_len(spec)))
        return dataclasses.replace(arch, decoder_seq_len=_decoder_len(spec)) if isinstance(arch, DerivedModelSpec) \
            else arch
    if form == "module":
        _only(spec, ("module", "kwargs", "input_shape", "num_classes", "name"))
        return _module(spec)
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


def _module(spec: dict[str, Any]) -> DerivedModelSpec:
    factory = spec["module"]
    mod, sep, attr = factory.partition(":") if isinstance(factory, str) else ("", "", "")
    if not (mod and sep and attr):
        raise ModelSpecError("model.module", f"give 'package.module:factory', e.g. 'torchvision.models:resnet50', "
                                             f"got {factory!r}")
    kwargs = spec.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise ModelSpecError("model.kwargs", f"must be a mapping of the factory's arguments, got {kwargs!r}")
    for key in ("weights", "pretrained"):
        if kwargs.get(key) not in (None, False):
            raise ModelSpecError(f"model.kwargs.{key}", "would load published weights; models are planned from "
                                                         "random init (leave it out)")
    shape = spec.get("input_shape")
    if not isinstance(shape, list) or not shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1
                                                       for d in shape):
        raise ModelSpecError("model.input_shape", f"must be the per-sample input shape, a list of positive "
                                                  f"integers such as [3, 224, 224], got {shape!r}")
    classes = spec.get("num_classes", kwargs.get("num_classes", 1000))
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 1:
        raise ModelSpecError("model.num_classes", f"must be a positive integer, got {classes!r}")
    out = {"module": factory, "kwargs": dict(kwargs), "input_shape": list(shape), "num_classes": classes}
    return DerivedModelSpec("module", out, "", "", f"module {factory}", "model.module")


def _from_hf_file(rel: Any, base_dir: Path, derive: bool = False, key: str = "model.hf_config",
                  origin: str = "") -> Architecture | DerivedModelSpec:
    from .hf import architecture_from_hf, supported_model_types

    if not isinstance(rel, str) or not rel:
        raise ModelSpecError(key, f"must be a path to a config.json (or a model folder holding one), got {rel!r}")
    path = Path(rel) if Path(rel).is_absolute() else base_dir / rel
    if path.is_dir():  # a local Hugging Face snapshot folder
        path = path / "config.json"
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
    if not isinstance(cfg, dict):
        raise ModelSpecError(key, f"{path}: a config.json holds a JSON object, got {type(cfg).__name__}")
    if derive or cfg.get("model_type") not in supported_model_types():
        if not cfg.get("architectures"):
            raise ModelSpecError(key, f"{path}: 'architectures' names no model class (e.g. [\"Qwen3ForCausalLM\"]); "
                                      "the model is built from the class it names")
        return DerivedModelSpec("hf", cfg, str(cfg.get("_name_or_path") or ""), "", origin or str(rel), key)
    try:
        return architecture_from_hf(cfg, origin=origin or str(rel))
    except ValueError as e:
        raise ModelSpecError(key, f"{path}: {e}") from None
