"""Column names of results.csv / the results DataFrame: a contract defined once.

Long format: one row per grid point and GPU. Byte columns are int64 and end in `_bytes`.
The component columns are what is live *at the peak moment* of the step (the phase named in `peak_phase`),
so they add up exactly to `peak_allocated_bytes` on every row:

    weights + master_weights + gradients + optimizer + activations + kv_cache + temporary == peak_allocated
    reserved = peak_allocated + allocator_extra + reserve     (torch.cuda.max_memory_reserved())
    total    = reserved + non_torch                           overhead = total - peak_allocated
    fits     = total <= usable_bytes          (usable = gpu_memory, as PyTorch sees it, minus headroom)
"""

# Grid axes, in the order rows are expanded. Not every scenario uses every axis; unused ones hold a fixed value.
BATCH = "batch"
SEQ_LEN = "seq_len"
PRECISION = "precision"
OPTIMIZER = "optimizer"
OPTIMIZER_IMPL = "optimizer_impl"  # foreach | fused | forloop
CHECKPOINTING = "checkpointing"  # none | selective | full
ATTENTION = "attention"  # flash | eager
CACHE_TOKENS = "cache_tokens"  # inference: tokens already in the KV cache (prompt length)
DECODE_TOKENS = "decode_tokens"  # inference: tokens generated
GPU = "gpu"

GRID_AXES = (BATCH, SEQ_LEN, PRECISION, OPTIMIZER, OPTIMIZER_IMPL, CHECKPOINTING, ATTENTION,
             CACHE_TOKENS, DECODE_TOKENS)
# Axes other than batch: max_batch.csv has one row per combination of these and GPU.
NON_BATCH_AXES = tuple(a for a in GRID_AXES if a != BATCH)
# Optional grid axes: a column (after GRID_AXES, also in max_batch.csv) only when the scenario's grid names the axis;
# a frame without the column is estimated at OPTIONAL_DEFAULTS, so existing outputs keep their columns.
ZERO_GRAD = "zero_grad"  # set_to_none (torch >= 2.0's zero_grad default) | zeros (gradients kept between steps)
OPTIONAL_AXES = (ZERO_GRAD,)
OPTIONAL_DEFAULTS = {ZERO_GRAD: "set_to_none"}

MODE = "mode"  # train | infer
MODEL = "model"
# the releases the plan was made for (issue 21): a derived model's plans name the torch / transformers / peft they
# were traced with; a hand-modelled one the releases its measured cases were taken with (runner.HAND_STACK)
PLAN_STACK = "plan_stack"

# Components live at the peak (int64 bytes).
WEIGHTS = "weights_bytes"
MASTER_WEIGHTS = "master_weights_bytes"
GRADIENTS = "gradients_bytes"
OPTIMIZER_STATE = "optimizer_bytes"
ACTIVATIONS = "activations_bytes"
KV_CACHE = "kv_cache_bytes"
TEMPORARY = "temporary_bytes"  # transients at the peak: optimizer foreach buffers, loss/logit temporaries ...
COMPONENTS = (WEIGHTS, MASTER_WEIGHTS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS, KV_CACHE, TEMPORARY)

PEAK_ALLOCATED = "peak_allocated_bytes"  # what torch.cuda.max_memory_allocated() would report
PEAK_PHASE = "peak_phase"  # forward | backward | optimizer | prefill | decode
ALLOCATOR_EXTRA = "allocator_extra_bytes"  # library workspaces (cuBLAS) inside the allocator, unseen by a CPU trace
RESERVED = "reserved_bytes"  # peak reserved: peak_allocated + allocator_extra + the allocator's reserve
NON_TORCH = "non_torch_bytes"  # outside the allocator: CUDA context with loaded modules, NCCL communicators
OVERHEAD = "overhead_bytes"  # total - peak_allocated: everything the CPU trace does not see
TOTAL = "total_bytes"  # reserved + non_torch: what the process takes on the device
GPU_MEMORY = "gpu_memory_bytes"  # capacity PyTorch sees (torch.cuda.mem_get_info()'s total), not nvidia-smi's
USABLE = "usable_bytes"  # gpu_memory minus headroom
FITS = "fits"

BYTE_COLUMNS = COMPONENTS + (PEAK_ALLOCATED, ALLOCATOR_EXTRA, RESERVED, NON_TORCH, OVERHEAD, TOTAL, GPU_MEMORY, USABLE)

# max_batch.csv
MAX_BATCH = "max_batch"  # largest batch that fits with headroom; 0 when even batch 1 does not fit
TOTAL_AT_MAX_BATCH = "total_at_max_batch_bytes"
TOTAL_AT_BATCH_1 = "total_at_batch_1_bytes"

# Serving plans (infer scenarios; nnmem_sweep/serving.py): max_concurrency.csv and max_context.csv
KV_DTYPE = "kv_dtype"  # auto | bf16 | fp16 | fp8 | int8 (grid.kv_dtype)
TENSOR_PARALLEL = "tensor_parallel"  # GPUs one model replica is split over (serving.tensor_parallel)
CONTEXT = "context"  # tokens per sequence: prompt (seq_len) + generated (decode_tokens)
KV_BYTES_PER_SEQUENCE = "kv_bytes_per_sequence"  # one sequence's KV cache on one GPU at `context` (whole blocks)
KV_BUDGET = "kv_budget_bytes"  # what the engine leaves for the KV cache on one GPU
MAX_CONCURRENT = "max_concurrent_sequences"  # floor(kv_budget / kv_bytes_per_sequence)
KV_TOKENS_FIT = "kv_tokens_fit"  # tokens the KV budget holds (whole blocks when paged)
CONCURRENCY = "concurrency"  # sequences served at once (the grid's batch values)
MAX_CONTEXT = "max_context"  # longest context each of `concurrency` sequences can have (capped at max_position)
MAX_CONCURRENCY_COLUMNS = (GPU, TENSOR_PARALLEL, PRECISION, KV_DTYPE, CONTEXT, KV_BYTES_PER_SEQUENCE, KV_BUDGET,
                           MAX_CONCURRENT, KV_TOKENS_FIT)
MAX_CONTEXT_COLUMNS = (GPU, TENSOR_PARALLEL, PRECISION, KV_DTYPE, CONCURRENCY, KV_BUDGET, MAX_CONTEXT)

# Parallelism and sharding (issue 4; nnmem_sweep/parallel/): the scenario's `parallel:` block. A scenario that names
# none of them has none of these columns; one that names any has all of them (defaults in PARALLEL_DEFAULTS), and
# max_batch.csv groups by them too. Byte columns are then per GPU on the most loaded rank.
DATA_PARALLEL = "data_parallel"  # model replicas (ZeRO shards over them)
ZERO_STAGE = "zero_stage"  # 0..3 (FSDP SHARD_GRAD_OP = 2, FULL_SHARD = 3)
# TENSOR_PARALLEL (above) is reused: GPUs one layer's matrices are split over
SEQUENCE_PARALLEL = "sequence_parallel"  # bool: Megatron sequence parallelism beside tensor parallelism
PIPELINE_PARALLEL = "pipeline_parallel"  # pipeline stages
MICRO_BATCHES = "micro_batches"  # pipeline micro-batches per optimizer step (batch is the micro-batch size)
PIPELINE_SCHEDULE = "pipeline_schedule"  # 1f1b | interleaved
VIRTUAL_STAGES = "virtual_stages"  # model chunks per pipeline rank (interleaved schedule)
CONTEXT_PARALLEL = "context_parallel"  # GPUs the sequence is split over (ring attention)
EXPERT_PARALLEL = "expert_parallel"  # GPUs the experts are split over (MoE), carved out of data_parallel
OFFLOAD = "offload"  # none | optimizer | optimizer+params (ZeRO-Offload to host memory)
OFFLOAD_PARAMS = "optimizer+params"  # offload's value for parameters too (ZeRO-3's offload_param, FSDP1's CPUOffload)
GRADIENT_ACCUMULATION = "gradient_accumulation"  # micro-batches accumulated per optimizer step (no pipeline)
FP32_GRAD_ACCUMULATION = "fp32_grad_accumulation"  # bool: Megatron-style fp32 main grads
# each | last: sharded gradients reduce-scattered every micro-batch (FSDP2's default, accelerate's sync_each_batch)
# or only the last one's (accelerate's no_sync, its default under FSDP: the unsharded gradients kept until then)
GRADIENT_SYNC = "gradient_sync"
# bool: PyTorch DDP's gradient_as_bucket_view (the .grad tensors are views of the allreduce buckets: no second copy,
# but they stay allocated from one step to the next)
DDP_BUCKET_VIEW = "ddp_bucket_view"
# 1 | 2: PyTorch's FSDP1 (FullyShardedDataParallel, flat parameters; accelerate's FSDP plugin's default) or FSDP2
# (fully_shard, per-parameter DTensors) for a layout FSDP shards (parallel/fsdp.py); ignored by other layouts
FSDP_VERSION = "fsdp_version"
# pre | none: FSDP1's backward prefetch, BACKWARD_PRE (PyTorch's default: a unit's backward all-gathers the next
# unit's parameters first) or none (accelerate's FSDP plugin's and the Trainer's default, NO_PREFETCH); FSDP1 only
BACKWARD_PREFETCH = "backward_prefetch"
# DeepSpeed ZeRO's communication buffers (parallel/states.py deepspeed_buffers; `parallel.deepspeed:` fills them with
# DeepSpeed's defaults or a ds_config's values); 0 / False: a ZeRO layout that is not DeepSpeed's (FSDP)
REDUCE_BUCKET = "reduce_bucket_size"  # elements of DeepSpeed's gradient reduce bucket
OVERLAP_COMM = "overlap_comm"  # bool: DeepSpeed overlap_comm (ZeRO-1/2 keep a second reduce bucket)
PREFETCH_BUCKET = "prefetch_bucket_size"  # elements ZeRO-3 prefetches ahead (stage3_prefetch_bucket_size)
PARALLEL_AXES = (DATA_PARALLEL, ZERO_STAGE, TENSOR_PARALLEL, SEQUENCE_PARALLEL, PIPELINE_PARALLEL, MICRO_BATCHES,
                 PIPELINE_SCHEDULE, VIRTUAL_STAGES, CONTEXT_PARALLEL, EXPERT_PARALLEL, OFFLOAD,
                 GRADIENT_ACCUMULATION, FP32_GRAD_ACCUMULATION, REDUCE_BUCKET, OVERLAP_COMM, PREFETCH_BUCKET,
                 GRADIENT_SYNC, DDP_BUCKET_VIEW, FSDP_VERSION, BACKWARD_PREFETCH)
# true/false values, kept as bools
PARALLEL_BOOL_AXES = (SEQUENCE_PARALLEL, FP32_GRAD_ACCUMULATION, OVERLAP_COMM, DDP_BUCKET_VIEW)
PARALLEL_DEFAULTS = {DATA_PARALLEL: 1, ZERO_STAGE: 0, TENSOR_PARALLEL: 1, SEQUENCE_PARALLEL: False,
                     PIPELINE_PARALLEL: 1, MICRO_BATCHES: 1, PIPELINE_SCHEDULE: "1f1b", VIRTUAL_STAGES: 1,
                     CONTEXT_PARALLEL: 1, EXPERT_PARALLEL: 1, OFFLOAD: "none", GRADIENT_ACCUMULATION: 1,
                     FP32_GRAD_ACCUMULATION: False, REDUCE_BUCKET: 0, OVERLAP_COMM: False, PREFETCH_BUCKET: 0,
                     GRADIENT_SYNC: "each", DDP_BUCKET_VIEW: False, FSDP_VERSION: 2,
                     BACKWARD_PREFETCH: "pre"}
# The node a rank runs on (scenario `node:`), carried as columns beside gpu_memory_bytes when PARALLEL_AXES are
GPUS_PER_NODE = "gpus_per_node"
HOST_MEMORY = "host_memory_bytes"  # the node's RAM
HOST = "host_bytes"  # host (CPU) memory the offloaded states take on one node: per rank x gpus_per_node
HOST_FITS = "host_fits"  # host_bytes <= host_memory_bytes (a row that does not is not `fits`)
