"""Multi-process tests under torch.distributed: a world of processes spawned once per test module, each
running every scenario of the module and reporting each one's outcome (None, or its traceback), under one
timeout so that a hang fails the tests instead of stalling CI.

A test module lists its scenarios (module-level functions `scenario(ctx)`, picklable by name) and asks for
their outcomes in a module-scoped fixture:

    @pytest.fixture(scope="module")
    def outcomes(tmp_path_factory):
        return run_world(__name__, SCENARIOS, world=2, tmp=tmp_path_factory.mktemp("tp"))

    def test_x(outcomes):
        check(outcomes["x"])

On CPU the world uses gloo; `backend="nccl"` puts rank r on cuda:r (callers skip when fewer GPUs exist).
"""

from __future__ import annotations

import dataclasses
import importlib
import multiprocessing
import os
import queue as queue_module
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch


@dataclasses.dataclass
class Ctx:
    """What a scenario gets: its rank, the world size, the device its tensors go on, and a scratch
    directory shared by the ranks (for checkpoints)."""

    rank: int
    world: int
    device: torch.device
    shared_dir: Path
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def mesh(self, shape: Sequence[int] | None = None, names: Sequence[str] | None = None):
        """A device mesh over the world (1-D unless `shape` says otherwise)."""
        from torch.distributed.device_mesh import init_device_mesh

        shape = tuple(shape or (self.world,))
        return init_device_mesh(self.device.type, shape, mesh_dim_names=tuple(names) if names else None)


def available(backend: str = "gloo", world: int = 2) -> str | None:
    """Why a world cannot run here (None when it can)."""
    if not torch.distributed.is_available():
        return "torch.distributed is not available"
    if backend == "gloo" and not torch.distributed.is_gloo_available():
        return "gloo is not available"
    if backend == "nccl":
        if not torch.distributed.is_nccl_available():
            return "nccl is not available"
        if torch.cuda.device_count() < world:
            return f"needs {world} GPUs, this machine has {torch.cuda.device_count()}"
    return None


def _worker(rank: int, world: int, backend: str, init_file: str, module: str, names: Sequence[str],
            shared_dir: str, results) -> None:
    if backend == "gloo":
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import torch.distributed as dist

    outcomes: dict[str, str | None] = {}
    try:
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
        mod = importlib.import_module(module)
        ctx = Ctx(rank, world, device, Path(shared_dir))
        setup: Callable[[Ctx], None] | None = getattr(mod, "setup_rank", None)
        if setup is not None:
            setup(ctx)
        for name in names:
            try:
                getattr(mod, name)(ctx)
                outcomes[name] = None
            except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
                outcomes[name] = traceback.format_exc()
            dist.barrier()
    except BaseException:  # noqa: BLE001
        outcomes["__setup__"] = traceback.format_exc()
    finally:
        results.put((rank, outcomes))
        if dist.is_initialized():
            dist.destroy_process_group()


def run_world(module: str, scenarios: Sequence[str], *, world: int, tmp: Path, timeout_s: float = 120,
              backend: str = "gloo") -> dict[str, dict[int, str | None]]:
    """Spawn `world` processes running `module`'s `scenarios` (function names) in order; each scenario's
    outcome on each rank. Skips when the backend cannot run here; fails when a rank reports nothing within
    `timeout_s` (the processes are killed then)."""
    why = available(backend, world)
    if why:
        pytest.skip(why)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    init_file = str(tmp / "init")
    shared = tmp / "shared"
    shared.mkdir(exist_ok=True)
    procs = [ctx.Process(target=_worker, daemon=True,
                         args=(rank, world, backend, init_file, module, list(scenarios), str(shared), results))
             for rank in range(world)]
    for proc in procs:
        proc.start()
    got: dict[int, dict[str, str | None]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < world:
            rank, ranks_outcomes = results.get(timeout=max(deadline - time.monotonic(), 0.1))
            got[rank] = ranks_outcomes
    except queue_module.Empty:
        pass
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if len(got) < world:
        pytest.fail(f"ranks {sorted(set(range(world)) - set(got))} reported nothing within {timeout_s} s "
                    f"(exit codes {[p.exitcode for p in procs]})")
    setup_failures = {rank: o["__setup__"] for rank, o in got.items() if "__setup__" in o}
    if setup_failures:
        pytest.fail("\n".join(f"rank {rank} failed to start:\n{tb}" for rank, tb in setup_failures.items()))
    return {name: {rank: got[rank].get(name, "not run") for rank in got} for name in scenarios}


def check(outcome: dict[int, str | None]) -> None:
    """Fail with every rank's traceback when a scenario failed on any rank."""
    failed = {rank: tb for rank, tb in outcome.items() if tb is not None}
    assert not failed, "\n".join(f"rank {rank}:\n{tb}" for rank, tb in failed.items())
