"""Pure vectorised memory formulas, one module per component (weights, optimizer, activations, kv, overhead,
finetune, cpu_kernels), the Term they are written in (terms.py), and the plans built from them: the machinery
(plan.py) and the plans of one GPU (train_plan.py, infer_plan.py)."""
