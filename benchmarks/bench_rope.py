"""RoPE (q and k together; rotate-half and interleaved) and the token embedding's deterministic backward vs eager,
torch.compile and Liger-Kernel.

    python benchmarks/bench_rope.py            # a fresh bench-results/rope-<device>-<time>/
    python benchmarks/bench_rope.py --out DIR  # DIR/rope.{json,md} and plots; on a GPU, committed as
                                               #   benchmarks/results/rope_<device>.{json,md}

The suite itself lives in kernel_pytorch.benchmark.suites.rope (also `kernel-pytorch bench rope`);
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
    sys.exit(main(["bench", "rope", *sys.argv[1:]]))
