"""RMSNorm, LayerNorm and fused add+RMSNorm vs eager, torch.compile and Liger-Kernel.

    python benchmarks/bench_norm.py            # a fresh bench-results/norm-<device>-<time>/
    python benchmarks/bench_norm.py --out DIR  # DIR/norm.{json,md} and plots; on a GPU, committed as
                                               #   benchmarks/results/norm_<device>.{json,md}

The suite itself lives in kernel_pytorch.benchmark.suites.norm (also `kernel-pytorch bench norm`);
this script only forwards its arguments to the CLI, which refuses to replace results already in --out
unless --overwrite is given.
"""

from __future__ import annotations

import sys
from pathlib import Path

# run from a source checkout without installing: put src/ first on the path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kernel_pytorch.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", "norm", *sys.argv[1:]]))
