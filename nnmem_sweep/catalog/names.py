"""The vocabularies a scenario may use, defined once.

The JSON Schema (nnmem_sweep/schema/scenario.schema.json) spells the same lists for editors; a test keeps the two
equal. The estimator's catalogs (precisions.py, optimizers.py) give each name its meaning.
"""
from __future__ import annotations

MODES = ("train", "infer")

# FORMULAS.md, "Precision recipes".
PRECISIONS = ("fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed", "bf16-master", "int8", "int4", "nf4", "fp8")
# Quantised weights are an inference format here (no training recipe stores int4 weights and fp32 grads).
INFER_ONLY_PRECISIONS = ("int8", "int4", "nf4", "fp8")

# KV cache dtype of a serving plan (grid.kv_dtype), independent of the weights; "auto" = the recipe's activation
# dtype, as vLLM's kv_cache_dtype="auto" means the model dtype.
KV_DTYPES = ("auto", "bf16", "fp16", "fp8", "int8")

# "none" means no optimizer: the only value inference takes, and not a training choice.
OPTIMIZER_NONE = "none"
OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw", "adamw-8bit", "adafactor", "lion", "adagrad", "rmsprop")

# torch.optim implementations; "none" again only for inference.
OPTIMIZER_IMPLS = ("foreach", "fused", "forloop")
CHECKPOINTING = ("none", "selective", "full")
ATTENTION = ("flash", "eager")
# what optimizer.zero_grad() leaves between steps (the optional grid axis zero_grad; workload/steps.py runs both)
ZERO_GRADS = ("set_to_none", "zeros")

PAPER_SIZES = ("A4", "Letter")
