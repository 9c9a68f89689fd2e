"""Parallelism and sharding: memory per GPU on the most loaded rank (issue 4).

layout.py      the parallel layout of a grid point (a frozen dataclass) and its validity rules
states.py      model states per rank: tensor/pipeline/expert split, ZeRO sharding, offload to host memory
activations.py activations per rank: Korthikanti et al. 2022 tensor/sequence/pipeline split, context parallel
plan.py        the plans of frames with parallel layouts (training plan, inference per layout's rank model),
               called by peak.py for frames with parallel columns
"""
