"""Cross-entropy and fused linear + cross-entropy vs eager, torch.compile and Liger-Kernel (time and
peak memory).

    python benchmarks/bench_cross_entropy.py            # a fresh bench-results/cross_entropy-<device>-<time>/
    python benchmarks/bench_cross_entropy.py --out DIR  # DIR/cross_entropy.{json,md} and plots; on a GPU, committed as
                                                        #   benchmarks/results/cross_entropy_<device>.{json,md}

The suite itself lives in kernel_pytorch.benchmark.suites.cross_entropy (also `kernel-pytorch bench
cross_entropy`);
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
    sys.exit(main(["bench", "cross_entropy", *sys.argv[1:]]))
