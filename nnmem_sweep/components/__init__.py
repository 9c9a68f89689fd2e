"""Pure vectorised memory formulas, one module per component. Importing this package registers their citations."""
from . import activations, finetune, kv, optimizer, overhead, peak, terms, weights  # noqa: F401
