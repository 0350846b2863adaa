"""Tensor and sequence parallelism for models built from kernel_pytorch's modules.

    from kernel_pytorch.distributed import tensor_parallel
    model = tensor_parallel(model, mesh, dim="tp")   # llama_tp_plan + torch's parallelize_module

`plan.py`: `llama_tp_plan(model, mesh, dim=)` (the plan of a Llama-style decoder, checked before anything is
sharded), `tensor_parallel` (the plan applied), `tp_mesh`; `styles.py`: the parallel styles it adds to
torch's, `GatedMLPParallel` (our gated MLP sharded with its fused block kept) and `SequenceParallelNorm`.
The ops themselves take DTensors through their sharding rules (ops/_common/sharding.py); this package
only says how a model's modules are sharded. Needs torch.distributed.
"""

from kernel_pytorch.distributed.plan import llama_tp_plan, tensor_parallel, tp_mesh
from kernel_pytorch.distributed.styles import GatedMLPParallel, SequenceParallelNorm

__all__ = ["GatedMLPParallel", "SequenceParallelNorm", "llama_tp_plan", "tensor_parallel", "tp_mesh"]
