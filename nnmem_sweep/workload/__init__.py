"""The workload a model runs for a memory figure: how a case's model, optimizer and inputs are built (build.py,
inputs.py, hf_configs.py) and run phase by phase (steps.py). `measure` records it under MemTracker (the committed
truth); the derive package traces it at probe shapes (the plans of models without a hand model). Needs torch."""
