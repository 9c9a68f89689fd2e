"""The fine-tuning method a scenario names: full (every weight trained), LoRA or QLoRA (a frozen base and trained
adapters), as a Finetune (`finetune:` read and checked by parse_finetune, defaults as peft's LoraConfig), and the
adapter tensors it adds: which linears of a block peft wraps (targets_of) and the shapes of A and B
(adapter_shapes). The bytes they cost are finetune.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import Problem, ScenarioError, UsageError
from ..models.arch import Architecture

METHODS = ("full", "lora", "qlora")
ADAPTER_DTYPES = ("fp32", "model")  # peft autocast_adapter_dtype=True (16-bit adapters upcast to fp32) | False
ALL_LINEAR = "all-linear"  # peft's shortcut: every linear layer but the output layer

# Linear modules a target name selects, per family: (input source, out features, in features) of one layer.
# Input sources: "attn_in" (the attention norm's output), "attn_out" (attention output), "mlp_in" (the MLP norm's
# output), "mlp_mid" (the input of the MLP's output projection).
_LLAMA_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_GPT2_NAMES = ("c_attn", "c_proj", "c_fc")
TARGET_NAMES = (*_LLAMA_NAMES, *_GPT2_NAMES, ALL_LINEAR)
LORA_FAMILIES = ("llama", "mistral", "qwen2", "mixtral", "gpt2")


@dataclass(frozen=True)
class Finetune:
    """A fine-tuning method. Defaults are peft's LoraConfig (r=8, lora_alpha=8, lora_dropout=0.0, the model type's
    default targets) with get_peft_model's fp32 adapters; parse_finetune gives QLoRA the QLoRA paper's recipe
    (r=64, α=16, dropout 0.1, every linear layer)."""

    method: str = "full"
    rank: int = 8
    alpha: float = 8
    targets: tuple[str, ...] = ()  # (): peft's default for the model (PEFT_DEFAULT_TARGETS)
    dropout: float = 0.0
    adapter_dtype: str = "fp32"
    modules_to_save: tuple[str, ...] = ()  # modules peft copies and trains whole (embeddings, head, norms)

    @property
    def adapters(self) -> bool:
        return self.method in ("lora", "qlora")


FULL = Finetune()
# peft utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING, used when target_modules is None
PEFT_DEFAULT_TARGETS = {"llama": ("q_proj", "v_proj"), "mistral": ("q_proj", "v_proj"), "qwen2": ("q_proj", "v_proj"),
                        "mixtral": ("q_proj", "v_proj"), "gpt2": ("c_attn",)}
_DEFAULTS = {
    "lora": {},
    # QLoRA §4 / Appendix B: r = 64, α = 16, dropout 0.1 (models up to 13B), adapters on all linear block layers
    "qlora": {"rank": 64, "alpha": 16, "dropout": 0.1, "targets": (ALL_LINEAR,)},
}

MODULE_NAME = r"^[A-Za-z_][A-Za-z0-9_.\-]*$"  # a module name or dotted suffix, as peft matches it

FINETUNE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Fine-tuning method (issue 4): full (every weight trained), lora (frozen base + adapters) or "
                   "qlora (NF4 frozen base + adapters). Defaults: peft LoraConfig (rank 8, alpha 8, dropout 0, "
                   "q_proj/v_proj, fp32 adapters); qlora: rank 64, alpha 16, dropout 0.1, all-linear.",
    "additionalProperties": False,
    "required": ["method"],
    "properties": {
        "method": {"enum": list(METHODS)},
        "rank": {"type": "integer", "minimum": 1, "description": "r: the adapters' inner dimension"},
        "alpha": {"type": "number", "exclusiveMinimum": 0, "description": "lora_alpha (scaling α/r; no bytes)"},
        "targets": {"type": "array", "minItems": 1, "uniqueItems": True,
                    "items": {"type": "string", "pattern": MODULE_NAME},
                    "description": "module names peft wraps (the suffix of a linear's name: q_proj, qkv_proj, "
                                   "c_attn ...), or all-linear; default: peft's for the model type (q_proj, v_proj; "
                                   "GPT-2 c_attn)"},
        "modules_to_save": {"type": "array", "minItems": 1, "uniqueItems": True,
                            "items": {"type": "string", "pattern": MODULE_NAME},
                            "description": "modules peft copies and trains whole beside the adapters (peft's "
                                           "modules_to_save: embed_tokens, lm_head, a norm); planned from the "
                                           "model's own code"},
        "dropout": {"type": "number", "minimum": 0, "exclusiveMaximum": 1, "description": "lora_dropout"},
        "adapter_dtype": {"enum": list(ADAPTER_DTYPES),
                          "description": "fp32 (peft's default upcast of 16-bit adapters) or the model's dtype"},
    },
}

Locator = Callable[[str], tuple[str, "int | None", "int | None"]]


def parse_finetune(node: Any, where: Locator | str = "<scenario>", path: str = "finetune") -> Finetune:
    """The `finetune` mapping of a scenario as a Finetune; every problem found raised at once as a ScenarioError.
    `where(key_path)` gives (file, line, column) of a key path, as config.py's builder knows it; a string is a
    file name without positions. None (the key absent) is full fine-tuning."""
    locate: Locator = (lambda p, f=where: (f, None, None)) if isinstance(where, str) else where
    problems: list[Problem] = []

    def bad(key: str, message: str) -> None:
        p = f"{path}.{key}" if key else path
        file, line, col = locate(p)
        problems.append(Problem(file, line, col, p, message))

    if node is None:
        return FULL
    if not isinstance(node, dict):
        bad("", f"expected a mapping such as {{method: lora, rank: 16}}, got {type(node).__name__}")
        raise ScenarioError(problems)
    for key in node:
        if key not in FINETUNE_SCHEMA["properties"]:
            bad(str(key), f"unknown key {key!r} (allowed: {', '.join(FINETUNE_SCHEMA['properties'])})")
    method = node.get("method", None)
    if method not in METHODS:
        bad("method", f"{method!r} is not one of: {', '.join(METHODS)}" if "method" in node else
            f"missing required key 'method' ({', '.join(METHODS)})")
        raise ScenarioError(problems)
    if method == "full":
        for key in node:
            if key != "method" and key in FINETUNE_SCHEMA["properties"]:
                bad(str(key), "applies to lora and qlora only (full fine-tuning trains every weight)")
        if problems:
            raise ScenarioError(problems)
        return FULL
    values: dict[str, Any] = {**{k: getattr(FULL, k) for k in ("rank", "alpha", "targets", "dropout",
                                                                "adapter_dtype", "modules_to_save")},
                              **_DEFAULTS[method]}
    if "rank" in node:
        r = node["rank"]
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            bad("rank", f"must be a whole number ≥ 1, got {r!r}")
        else:
            values["rank"] = r
    if "alpha" in node:
        a = node["alpha"]
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not a > 0:
            bad("alpha", f"must be a number > 0, got {a!r}")
        else:
            values["alpha"] = a
    if "dropout" in node:
        d = node["dropout"]
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d < 1:
            bad("dropout", f"must be a number in [0, 1), got {d!r}")
        else:
            values["dropout"] = float(d)
    if "adapter_dtype" in node:
        t = node["adapter_dtype"]
        if t not in ADAPTER_DTYPES:
            bad("adapter_dtype", f"{t!r} is not one of: {', '.join(ADAPTER_DTYPES)}")
        else:
            values["adapter_dtype"] = t
    for key in ("targets", "modules_to_save"):
        if key not in node:
            continue
        ts = node[key]
        ts = [ts] if isinstance(ts, str) else ts
        if not isinstance(ts, list) or not ts:
            bad(key, "must be a non-empty list of module names, e.g. [q_proj, v_proj]" +
                (" or [all-linear]" if key == "targets" else ""))
            continue
        wrong = [i for i, t in enumerate(ts) if not (isinstance(t, str) and re.match(MODULE_NAME, t))]
        for i in wrong:
            bad(f"{key}[{i}]", f"{ts[i]!r} is not a module name (letters, digits, '_', '.', '-')")
        if len(set(map(str, ts))) != len(ts):
            bad(key, "lists the same module twice")
        elif key == "targets" and ALL_LINEAR in ts and len(ts) > 1:
            bad(key, "all-linear already selects every linear layer; list it alone")
        elif not wrong:
            values[key] = tuple(ts)
    if problems:
        raise ScenarioError(problems)
    return Finetune(method=method, **values)


# ---------------------------------------------------------------- adapter tensors

@dataclass(frozen=True)
class Target:
    """One targeted linear of a layer: the module peft wraps."""

    name: str
    source: str  # which tensor it reads (attn_in, attn_out, mlp_in, mlp_mid)
    out_f: int
    in_f: int


def block_linears(arch: Architecture) -> list[tuple[str, Target]]:
    """(target name, linear) for one block, in forward order."""
    h, i = arch.hidden, arch.intermediate
    hq, hkv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    if arch.family == "gpt2":  # Conv1D modules, wrapped by peft the same way (fan_in_fan_out)
        return [("c_attn", Target("c_attn", "attn_in", hq + 2 * hkv, h)),
                ("c_proj", Target("attn.c_proj", "attn_out", h, hq)),
                ("c_fc", Target("c_fc", "mlp_in", i, h)),
                ("c_proj", Target("mlp.c_proj", "mlp_mid", h, i))]
    out = [("q_proj", Target("q_proj", "attn_in", hq, h)), ("k_proj", Target("k_proj", "attn_in", hkv, h)),
           ("v_proj", Target("v_proj", "attn_in", hkv, h)), ("o_proj", Target("o_proj", "attn_out", h, hq))]
    if not arch.num_experts:  # MoE experts are 3-D parameters, not nn.Linear: peft's LoRA does not wrap them
        if arch.mlp == "gated":
            out.append(("gate_proj", Target("gate_proj", "mlp_in", i, h)))
        out += [("up_proj", Target("up_proj", "mlp_in", i, h)), ("down_proj", Target("down_proj", "mlp_mid", h, i))]
    return out


def hand_modelled(arch: Architecture, ft: Finetune) -> bool:
    """Whether the formulas of finetune.py model this fine-tune: LoRA of a causal-LM transformer of the families
    they were checked on, without modules_to_save. Every other model, these with modules_to_save, and QLoRA on any
    model (its 4-bit base traced through bitsandbytes' storage, workload/qlora.py) are planned from the model's own
    code with the adapters on it (components/derived.py)."""
    return (ft.method == "lora" and arch.kind == "transformer" and arch.family in LORA_FAMILIES
            and arch.head == "causal_lm" and not ft.modules_to_save)


def _check(arch: Architecture, ft: Finetune) -> None:
    if arch.kind != "transformer" or arch.family not in LORA_FAMILIES or arch.head != "causal_lm":
        raise UsageError(f"finetune {ft.method} is modelled for causal-LM transformers ({', '.join(LORA_FAMILIES)}); "
                         f"{arch.name or arch.family} is not one")


def targets_of(arch: Architecture, ft: Finetune) -> tuple[Target, ...]:
    """The linears of one block that carry adapters (every layer alike, as peft matches module-name suffixes)."""
    _check(arch, ft)
    linears = block_linears(arch)
    names = ft.targets or PEFT_DEFAULT_TARGETS[arch.family]
    if ALL_LINEAR in names:
        return tuple(t for _, t in linears)
    chosen = tuple(t for name, t in linears if name in names)
    missing = [n for n in names if n not in {name for name, _ in linears}]
    if missing:
        raise UsageError(f"finetune target(s) {', '.join(missing)} name no linear layer of {arch.name or arch.family}"
                         f"; its linears: {', '.join(dict.fromkeys(n for n, _ in linears))}")
    return chosen


def adapter_shapes(arch: Architecture, ft: Finetune) -> list[tuple[int, int]]:
    """(elements, how many) of every adapter tensor: A and B of each target in each layer."""
    shapes: dict[int, int] = {}
    for t in targets_of(arch, ft):
        for n in (ft.rank * t.in_f, t.out_f * ft.rank):
            shapes[n] = shapes.get(n, 0) + arch.layers
    return sorted(shapes.items())
