"""Preference tuning's training step, as TRL's trainers run it: what `measure` records and the derive package traces
for a scenario with a `preference:` block (issue 23).

A micro-batch is `batch` preference pairs of `seq_len` tokens each (prompt and completion). As DPOTrainer's
concatenated forward does, the chosen and the rejected sequences go through the policy as one batch of 2·batch; each
sequence's log-probability is the sum of its tokens' log-softmax at the next token (sequence_logps). Then:

    dpo     the reference's log-probabilities of the same 2·batch sequences, under no_grad: a frozen copy of the
            model (reference: model), the policy with its LoRA adapters disabled (reference: adapters), or given
            with the batch (reference: precomputed, as TRL's precompute_ref_log_probs); the loss
            −log σ(β·((π_c − ρ_c) − (π_r − ρ_r))), β = 0.1 (Rafailov et al. 2023, eq. 7)
    simpo,  reference-free: the log-probabilities normalised by the length, −log σ(β·(π_c − π_r) − γ) (SimPO, Meng et
    orpo    al. 2024; ORPO, Hong et al. 2024, adds the chosen sequences' NLL: the same tensors)

What is not modelled: GRPO/PPO (a generation inside the step, a reward model), reward-model training, TRL's
padding to the longest sequence of a batch (every sequence here is seq_len long).
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # torch is imported where a step runs: the config's checks (check) need none of it
    import torch

LOSSES = ("dpo", "simpo", "orpo")
REFERENCES = ("model", "adapters", "precomputed")
BETA, GAMMA = 0.1, 0.5  # no bytes: DPO's and SimPO's defaults


def make_inputs(case: dict[str, Any], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`batch` pairs: the chosen then the rejected sequences, concatenated along the batch (2·batch, seq_len), the
    labels a copy of the ids; with a precomputed reference, its log-probabilities (2·batch,) in fp32."""
    b, s = int(case["batch"]), int(case["seq_len"])
    vocab = int(model.config.get_text_config(decoder=True).vocab_size)
    import torch

    ids = torch.randint(0, vocab, (2 * b, s), dtype=torch.long)
    out = {"input_ids": ids, "labels": ids.clone()}
    if case["preference"].get("reference") == "precomputed":
        out["reference_logps"] = torch.zeros(2 * b, dtype=torch.float32)
    return out


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each sequence's summed log-probability of its next tokens (2·batch,). TRL loops over the sequences to bound
    its forward transients; autograd keeps each one's log-softmax for backward all the same, so the bytes are those
    of one log-softmax over the batch, which this computes (and which keeps the step one program at every batch
    size, as a derived plan needs)."""
    import torch

    lp = torch.log_softmax(logits[:, :-1], dim=-1)
    return lp.gather(-1, labels[:, 1:].unsqueeze(-1)).squeeze(-1).sum(-1)


def _adapters_off(model: torch.nn.Module):
    off = getattr(model, "disable_adapter", None)
    return off() if callable(off) else contextlib.nullcontext()


def loss_fn(spec: dict[str, Any], reference: torch.nn.Module | None) -> Callable[..., torch.Tensor]:
    """The step's loss for run_steps (Workload.loss_fn): policy forward of the 2·batch sequences, the reference's
    log-probabilities, the preference loss. `between()` is called between two forward calls of the same model
    (MemTracker keeps per-module records of one call)."""
    import torch

    kind, ref_kind = spec["loss"], spec.get("reference", "model")

    def loss(model: torch.nn.Module, inputs: dict[str, Any], between: Callable[[], None] = lambda: None):
        ids, labels = inputs["input_ids"], inputs["labels"]
        logits = model(input_ids=ids).logits
        logps = sequence_logps(logits, labels)
        del logits
        half = ids.shape[0] // 2
        if kind != "dpo":  # reference-free: length-normalised
            norm = logps / (ids.shape[1] - 1)
            return -torch.nn.functional.logsigmoid(BETA * (norm[:half] - norm[half:]) - GAMMA).mean()
        if ref_kind == "precomputed":
            ref = inputs["reference_logps"]
        else:
            if ref_kind == "adapters":
                between()
            with torch.no_grad(), (_adapters_off(model) if ref_kind == "adapters" else contextlib.nullcontext()):
                ref_logits = (model if ref_kind == "adapters" else reference)(input_ids=ids).logits
                ref = sequence_logps(ref_logits, labels)
                del ref_logits
        margin = (logps[:half] - ref[:half]) - (logps[half:] - ref[half:])
        return -torch.nn.functional.logsigmoid(BETA * margin).mean()

    return loss


def check(spec: dict[str, Any], lora: bool) -> None:
    """ValueError (one line) for a preference spec the step cannot run."""
    if spec.get("loss") not in LOSSES:
        raise ValueError(f"preference loss {spec.get('loss')!r} not in {LOSSES}")
    ref = spec.get("reference")
    if spec["loss"] != "dpo" and ref not in (None, "none"):
        raise ValueError(f"preference loss {spec['loss']} is reference-free: leave reference out")
    if ref == "adapters" and not lora:
        raise ValueError("reference: adapters is the policy with its LoRA adapters disabled: it needs finetune: "
                         "{method: lora}")
    if spec["loss"] == "dpo" and ref not in REFERENCES:
        raise ValueError(f"preference reference {ref!r} not in {REFERENCES}")
