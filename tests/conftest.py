"""Test-wide setup: caches in a directory of the session, Triton's interpreter on CPU-only machines, the
cuda marker, fixed seeds."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# Nothing the tests run writes under the user's home, and nothing there changes what they measure:
# kernel_pytorch's cache (measured ceilings) and matplotlib's go to a directory of this session, removed
# at its end. Set at import, before anything reads them, so the processes the tests start inherit it.
_SCRATCH = tempfile.mkdtemp(prefix="kernel_pytorch-tests-")
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)
os.environ["KERNEL_PYTORCH_CACHE_DIR"] = os.path.join(_SCRATCH, "cache")
os.environ["MPLCONFIGDIR"] = os.path.join(_SCRATCH, "matplotlib")

# Must happen before anything imports triton: without a GPU, kernels run in Triton's CPU interpreter.
try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover - torch is a hard dependency
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ.get("KP_SANITIZE") == "1":  # every interpreted load and store checked (tests/_sanitize.py)
        from tests._sanitize import install

        install()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
