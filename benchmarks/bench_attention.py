"""Attention (core causal, the whole block, document masks, one decoding step over a static KV cache) vs
transformers' eager code, torch.compile and a bare SDPA call; Liger-Kernel has no attention.

    python benchmarks/bench_attention.py            # a fresh bench-results/attention-<device>-<time>/
    python benchmarks/bench_attention.py --out DIR  # DIR/attention.{json,md} and plots; on a GPU, committed as
                                                    #   benchmarks/results/attention_<device>.{json,md}

The suite itself lives in kernel_pytorch.benchmark.suites.attention (also `kernel-pytorch bench attention`);
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
    sys.exit(main(["bench", "attention", *sys.argv[1:]]))
