"""What one transformer layer saves for backward, measured: `python -m nnmem_sweep.measure.probe`.

For a model family, precision and attention kernel, the probe measures the same model with 1 and 2 layers at three
sequence lengths (fake tensors, training forward). The difference of the tracked activations live at the end of
the forward pass (MemTracker's "Activation" category: everything autograd saved, in its real dtype) is one layer's
saved bytes A(s) for batch b. A(s) = c0 + c1·s + c2·s² is solved exactly from the three lengths: c1/b is bytes
per token per layer (reported also in units of h), c2/b the attention-matrix term, c0 anything independent of the
tokens (autocast's 16-bit weight copies kept for backward). The figures feed tests/data/truth/FINDINGS.md.
"""
from __future__ import annotations

import sys
from fractions import Fraction
from typing import Any

from ..workload.build import model_config
from .build import measure_case

LAYER_KEY = {"gpt2": "n_layer"}
HIDDEN_KEY = {"gpt2": "n_embd"}


def _forward_act(cfg: dict[str, Any], layers: int, precision: str, attention: str, b: int, s: int) -> int:
    key = LAYER_KEY.get(cfg["model_type"], "num_hidden_layers")
    case = {"hf_config": {**cfg, key: layers}, "mode": "train", "batch": b, "seq_len": s, "precision": precision,
            "optimizer": "sgd", "optimizer_impl": "foreach", "checkpointing": "none", "attention": attention}
    rec = measure_case(case, fake=True)
    return rec["phases"]["forward"]["end_categories"]["act"], rec["attention_kernel"]


def layer_profile(cfg: dict[str, Any], precision: str, attention: str, b: int = 2,
                  seqs: tuple[int, int, int] = (128, 256, 512)) -> dict[str, Any]:
    """Per-layer saved bytes A(s) = c0 + c1·s + c2·s² for batch b, solved exactly from three lengths."""
    a = []
    kernel = ""
    for s in seqs:
        one, kernel = _forward_act(cfg, 1, precision, attention, b, s)
        two, _ = _forward_act(cfg, 2, precision, attention, b, s)
        a.append(two - one)
    s1, s2, s3 = (Fraction(x) for x in seqs)
    # divided differences of a quadratic
    d1 = (a[1] - a[0]) / (s2 - s1)
    d2 = (a[2] - a[1]) / (s3 - s2)
    c2 = (d2 - d1) / (s3 - s1)
    c1 = d1 - c2 * (s1 + s2)
    c0 = a[0] - c1 * s1 - c2 * s1 * s1
    h = int(cfg.get(HIDDEN_KEY.get(cfg["model_type"], "hidden_size")))
    return {"kernel": kernel, "per_layer_bytes": a, "c0": c0, "c1": c1, "c2": c2, "b": b, "h": h,
            "per_token_bytes": c1 / b, "per_token_in_h": c1 / b / h, "s2_per_sample": c2 / b}


PROBES = (
    ("llama-3.2-1b", "bf16", "flash"),
    ("llama-3.2-1b", "bf16", "eager"),
    ("llama-3.2-1b", "bf16-mixed", "flash"),
    ("llama-3.2-1b", "fp32", "flash"),
    ("qwen2.5-0.5b", "bf16", "flash"),
    ("mixtral-small", "bf16", "flash"),
    ("gpt2", "fp32", "flash"),
    ("gpt2", "bf16-mixed", "flash"),
    ("bert-base", "fp32", "flash"),
)


def main(argv: list[str] | None = None) -> int:
    print("| model | precision | attention asked | kernel ran | bytes/token/layer | in units of h | "
          "s² bytes/sample/layer | token-independent bytes/layer |")
    print("|---|---|---|---|---|---|---|---|")
    for model, precision, attention in PROBES:
        cfg, _ = model_config({"model": model})
        p = layer_profile(cfg, precision, attention)
        print(f"| {model} | {precision} | {attention} | {p['kernel']} | {float(p['per_token_bytes']):,.1f} | "
              f"{float(p['per_token_in_h']):.3f} h | {float(p['s2_per_sample']):,.2f} | {float(p['c0']):,.0f} |",
              flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
