"""Pure vectorised memory formulas, one module per component, and the plans built from them. Importing this package
registers their citations."""
from . import activations, finetune, infer_plan, kv, optimizer, overhead, plan, terms, train_plan, weights  # noqa: F401
