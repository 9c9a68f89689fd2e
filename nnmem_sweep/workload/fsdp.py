"""A training step sharded as FSDP2 runs it (torch.distributed.fsdp.fully_shard), on one rank of a fake process group
(issue 22): every decoder block (the elements of the model's largest ModuleList) and then the root wrapped with
fully_shard over a 1-D mesh of `world` ranks, as torchtitan, accelerate and peft's FSDP guide wrap a transformer.

    zero_stage 3 (FULL_SHARD): blocks reshard after forward and all-gather again for backward
    zero_stage 2 (SHARD_GRAD_OP): blocks keep their unsharded parameters from forward to backward
    the root: fully_shard's default (no reshard after forward: its parameters are needed first in backward)

Parameters, gradients and optimizer state are then the rank's shards (Shard(0) of each parameter, padded to a multiple
of `world` rows); the collectives run on PyTorch's fake process group (no communication, every rank alike), so under
FakeTensorMode one rank of a 70B model costs nothing, and on one real GPU (the kit) one rank's step allocates what it
allocates among its ranks, with FSDP2's CUDA streams and events, less NCCL's own buffers. The optimizer steps the rank's
local shards (LocalShardOptimizer): the same tensors and the same foreach kernels a DTensor step dispatches to, without
DTensor's sharding propagation, whose fake ops a FakeTensorMode run would count as memory (tests/measure/test_fsdp.py).
Frozen base weights (LoRA, QLoRA's 4-bit storage) are sharded like any parameter; QLoRA's quant state stays whole on
every rank (it is module state, not a parameter), as with bitsandbytes under FSDP.

spec "version": 1 wraps the same units with FSDP1's FullyShardedDataParallel instead (_shard_fsdp1), as accelerate's
FSDP plugin does by default: measured to compare with the FSDP2 estimate (tests/data/truth/sharded/*fsdp1*).

spec "offload": "optimizer+params" adds FSDP1's CPUOffload(offload_params=True), as Answer.AI's FSDP-QLoRA and
accelerate's fsdp_offload_params run it, or FSDP2's CPUOffloadPolicy (pinned): each rank's shards and their gradients
live in pinned host memory and the optimizer steps there. On fake tensors the step runs with two stand-ins
(host_stand_ins): `Tensor.pin_memory` hands a fake tensor back (FakeTensor has no aten._pin_memory) and
`torch.cpu.Stream.synchronize` is a no-op (FSDP1's post-backward callback waits on its gradient copies' stream). Host
and device are then one pool; derive/step.py tells them apart (the rank's shards and CPU gradients registered as
host, the GPU's copy of each unit's shards before its all-gather recorded where FSDP makes it)."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from .. import columns as C

STAGES = (2, 3)


def version(spec: dict[str, Any] | None) -> int:
    """The FSDP version a case's `fsdp` spec names: 1 (FullyShardedDataParallel) or 2 (fully_shard, where not
    given); 2 for no spec (an unsharded case)."""
    return int((spec or {}).get("version", C.PARALLEL_DEFAULTS[C.FSDP_VERSION]))


def prefetch(spec: dict[str, Any] | None) -> str:
    """FSDP1's backward prefetch a case's `fsdp` spec names: "pre" (BACKWARD_PRE, where not given) or "none"."""
    return str((spec or {}).get("backward_prefetch", C.PARALLEL_DEFAULTS[C.BACKWARD_PREFETCH]))


def check(spec: dict[str, Any]) -> tuple[int, int]:
    world, stage = int(spec.get("world", 0)), int(spec.get("zero_stage", 3))
    if version(spec) not in (1, 2):
        raise ValueError(f"fsdp: version must be 1 (FullyShardedDataParallel) or 2 (fully_shard), "
                         f"got {spec['version']}")
    if world < 2:
        raise ValueError(f"fsdp: world must be at least 2, got {world}")
    if stage not in STAGES:
        raise ValueError(f"fsdp: zero_stage must be 2 (SHARD_GRAD_OP) or 3 (FULL_SHARD), got {stage}")
    if spec.get("offload", "none") not in ("none", C.OFFLOAD_PARAMS):
        raise ValueError(f"fsdp: offload must be none or {C.OFFLOAD_PARAMS}, got {spec['offload']!r}")
    if prefetch(spec) not in ("pre", "none"):
        raise ValueError(f"fsdp: backward_prefetch must be pre (BACKWARD_PRE) or none (FSDP1 only), got "
                         f"{spec['backward_prefetch']!r}")
    return world, stage


def offloaded(spec: dict[str, Any] | None) -> bool:
    """Whether a case's `fsdp` spec offloads the parameters, their gradients and the optimizer step to the host."""
    return (spec or {}).get("offload", "none") == C.OFFLOAD_PARAMS


@contextlib.contextmanager
def host_stand_ins() -> Iterator[None]:
    """What FSDP's CPU offload needs of the host that fake tensors lack (module docstring), for the duration: a fake
    tensor's pin_memory is the tensor itself, and the CPU stream's synchronize does nothing. Real tensors pin as
    they would where there is a GPU; without one (real CPU tensors, `measure --device cpu-real`) pinning cannot
    run, and the tensor itself holds the same bytes."""
    from torch._subclasses.fake_tensor import FakeTensor

    pin = torch.Tensor.pin_memory
    had_sync = "synchronize" in vars(torch.cpu.Stream)
    accelerator = torch.cuda.is_available()

    def pin_memory(self, *args, **kwargs):  # noqa: ANN001, ANN202
        return pin(self, *args, **kwargs) if accelerator and not isinstance(self, FakeTensor) else self

    torch.Tensor.pin_memory = pin_memory
    if not had_sync:
        torch.cpu.Stream.synchronize = lambda self: None
    try:
        yield
    finally:
        torch.Tensor.pin_memory = pin
        if not had_sync:
            del torch.cpu.Stream.synchronize


@contextlib.contextmanager
def fake_process_group(world: int, rank: int = 0) -> Iterator[None]:
    """PyTorch's fake process group of `world` ranks, this process `rank`, for the duration (one at a time)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    best = None
    for mod in model.modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > 1 and (best is None or len(mod) > len(best)):
            best = mod
    if best is None:
        raise ValueError("fsdp: the model has no repeated blocks (a ModuleList) to wrap")
    return best


def shard(model: torch.nn.Module, spec: dict[str, Any]) -> torch.nn.Module:
    """The model wrapped with fully_shard (module docstring); call inside fake_process_group(world)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    world, stage = check(spec)
    if version(spec) == 1:
        return _shard_fsdp1(model, stage, bool(spec.get("use_orig_params", False)), offloaded(spec),
                            prefetch(spec))
    # the mesh on the model's device: under FakeTensorMode the CPU (the collectives are the fake group's either
    # way); a real GPU run (the kit) keeps the model on the GPU, where FSDP2 runs its CUDA streams
    device = next(model.parameters()).device.type
    with unset_fake_temporarily():  # the mesh reads the ranks as real tensors
        mesh = init_device_mesh(device, (world,))
    policy = CPUOffloadPolicy() if offloaded(spec) else OffloadPolicy()  # CPUOffloadPolicy pins its shards
    for block in _blocks(model):
        fully_shard(block, mesh=mesh, reshard_after_forward=stage == 3, offload_policy=policy)
    fully_shard(model, mesh=mesh, offload_policy=policy)
    return model


def _shard_fsdp1(model: torch.nn.Module, stage: int, orig: bool = False, offload: bool = False,
                 prefetch: str = "pre") -> torch.nn.Module:
    """FSDP1 as accelerate's FSDP plugin wraps a model by default (fsdp_version 1, a FullyShardedDataParallel unit per
    decoder block and the root, use_orig_params False: one flat parameter per unit; limit_all_gathers True), with
    PyTorch's BACKWARD_PRE prefetch (`prefetch` "pre"; "none": accelerate's and the Trainer's default, which pass
    backward_prefetch=None: FULL_SHARD's backward holds one unit fewer, tests/measure/test_fsdp.py). Its
    flat parameters are plain tensors, so MemTracker follows the step and the optimizer steps them directly.
    `orig`: use_orig_params True, the Hugging Face Trainer's default (its fsdp_config), the original parameters
    views of the flat one (the optimizer steps the rank's views; the tracker leaves their gradient hooks out). With
    peft's adapters, peft's wrap policy, as the Trainer sets it. `offload`: CPUOffload(offload_params=True) (module
    docstring), the model given on the CPU as FSDP1 then requires."""
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    strategy = ShardingStrategy.FULL_SHARD if stage == 3 else ShardingStrategy.SHARD_GRAD_OP
    if any(not p.requires_grad for p in model.parameters()):
        # peft's adapters on a frozen base: the Trainer's wrap (transformers' update_fsdp_plugin_peft), each trainable
        # leaf module a unit of its own beside the decoder blocks, so every flat parameter is of one dtype and
        # requires_grad
        from peft.utils.other import fsdp_auto_wrap_policy

        policy = fsdp_auto_wrap_policy(model)
    else:
        policy = ModuleWrapPolicy({type(_blocks(model)[0])})
    return FullyShardedDataParallel(model, auto_wrap_policy=policy, sharding_strategy=strategy,
                                    use_orig_params=orig, limit_all_gathers=True,
                                    backward_prefetch=BackwardPrefetch.BACKWARD_PRE if prefetch == "pre" else None,
                                    cpu_offload=CPUOffload(offload_params=offload),
                                    device_id=next(model.parameters()).device)


def local(t: torch.Tensor) -> torch.Tensor:
    """A rank's own tensor of a parameter or gradient (a DTensor's local shard)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def gradient_sync_off(model: torch.nn.Module) -> Iterator[None]:
    """accelerate's no_sync for the duration: the micro-batches before the last keep their whole unsharded
    gradients. FSDP2: set_requires_gradient_sync(False), then True again; FSDP1: FullyShardedDataParallel.no_sync();
    an unsharded model: nothing."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if is_sharded(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    elif isinstance(model, FullyShardedDataParallel):
        with model.no_sync():
            yield
    else:
        yield


class LocalShardOptimizer:
    """A torch optimizer over the rank's local shards of FSDP2's DTensor parameters (module docstring): before each
    step their gradients' local shards are handed to it, after the step let go again (the DTensor gradients keep
    them until zero_grad, as in a DTensor step)."""

    def __init__(self, inner: torch.optim.Optimizer, params: list, shards: list) -> None:
        self.inner, self._pairs = inner, list(zip(params, shards))
        self.state, self.param_groups = inner.state, inner.param_groups

    def step(self) -> None:
        for p, shard in self._pairs:
            shard.grad = None if p.grad is None else local(p.grad).detach()
        self.inner.step()
        for _, shard in self._pairs:
            shard.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p, _ in self._pairs:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()
