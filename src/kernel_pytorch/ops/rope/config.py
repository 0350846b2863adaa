"""The rotary-embedding kernels' launch config, registered with `kernel_pytorch.ops.tuning` as "rope".

`RopeConfig` says which kernel runs (`schedule`, and where the flat kernel does not apply, a fallback
per pairing) and holds one small config per kernel: `TileConfig` (tile.py), `TokenConfig` (token.py),
`FlatConfig` (flat.py). Each default names the result that chose it. Benchmarks, probes and tests
change them only through the tuning context managers, for example

    with tuning.changed("rope", schedule="tile", tile=TileConfig(elements=32, tokens=2)):
        ...

Percentages below are of the copy bandwidth measured in the same run, q (4, 32, 4096, 128) + k
(4, 8, 4096, 128) bf16 in CUDA-graph replay, fwd / bwd, unless a comment says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from kernel_pytorch.ops import tuning

KERNELS = ("flat", "tile", "token")  # the names `schedule` takes
# How the tile kernel forms pairs (tile.py's docstring); the index is the kernel's PAIRS constexpr.
PAIR_METHODS = ("halves", "split", "partner")


@dataclass(frozen=True)
class TileConfig:
    """The tile kernel (tile.py): one [tokens, heads, r] tile of q or k a program."""

    # Elements of q or k a program holds (8 KiB of bf16). benchmarks/results/probes/rope/
    # probe_rope_variants_h200.log (H200, 2026-11-28): no setting of 4096-16384 elements, 4 or 8 warps or
    # 8-32 tokens went past 85.1% on either layout, and (B, T, H, D) was best at 4096, the smallest tried.
    elements: int = 4096
    # Tokens a tile takes where a head's tokens are contiguous ((B, H, T, D)): 2 KiB runs at D = 128;
    # the same sweep (8, 16, 32) left 8.
    tokens: int = 8
    # 4 warps: the per-token kernel's choice (TokenConfig), which the H200 sweep above did not beat with 8.
    num_warps: int = 4
    # How a tile forms rotate-half pairs. benchmarks/results/probes/rope/probe_rope_pairs_h100.log (H100,
    # 2026-11-23): "partner" 77.3 / 76.7% against "split" 77.4 / 77.4 and "halves" 76.1 / 75.7 on
    # (B, H, T, D), all three within 1.3 points; the tile kernel runs only where the flat one cannot.
    pairs_rotate_half: str = "partner"
    # Interleaved pairs: "split" (even/odd lanes of one load). The same probe: 77.9 / 77.9% against
    # "partner"'s 30.6 / 28.6 on (B, H, T, D), 87.7 / 87.8 against 31.0 / 31.3 on (B, T, H, D).
    pairs_interleaved: str = "split"

    def __post_init__(self) -> None:
        for name, method in (("pairs_rotate_half", self.pairs_rotate_half),
                             ("pairs_interleaved", self.pairs_interleaved)):
            if method not in PAIR_METHODS or (name == "pairs_interleaved" and method == "halves"):
                kind = "interleaved" if name == "pairs_interleaved" else "rotate-half"
                raise ValueError(f"no pair method {method!r} for {kind} pairs (TileConfig.{name})")
        _positive(self, "elements", "tokens", "num_warps")


@dataclass(frozen=True)
class TokenConfig:
    """The per-token kernel (token.py): one program per token, all its heads, a block of heads at a time."""

    # Elements of q or k a program holds per block of heads: 32 heads of 128 in one tile. Measured at
    # this size on an H100 (benchmarks/results/probes/rope/probe_rope_h100.log, 2026-11-23): fwd+bwd 86.2% of
    # copy rotate-half, 90.1% interleaved, (B, H, T, D).
    elements: int = 4096
    # The same H100 run: 4 warps beat 8 by 5-9 points in every layout and pairing.
    num_warps: int = 4

    def __post_init__(self) -> None:
        _positive(self, "elements", "num_warps")


@dataclass(frozen=True)
class FlatConfig:
    """The flat kernel (flat.py): a 1-D grid over contiguous runs of whole rows of dense q and k."""

    # Elements a program rotates: 2 KiB of bf16, 4 warps x 32 threads x one 16-byte vector.
    # benchmarks/results/probes/rope/probe_rope_flat_h200.log (H200, 2026-11-28, one (1, T, D) cos/sin table)
    # put 1024 x 4 warps first in both memory orders: (B, T, H, D) 86.0 / 85.8% against 82.6 / 82.8 for
    # 2048 and torch.compile's 87.8 / 81.2; 8192 fell to 65%.
    elements: int = 1024
    # The same sweep: 1024 elements on 8 warps collapsed to 56-64%.
    num_warps: int = 4
    # How rotate-half reads each feature's partner: "wrap", one load at (j + r/2) mod r; "halves", two
    # loads masked to the row's halves. The same sweep had "halves" 0-6 points behind "wrap" everywhere.
    partner: str = "wrap"
    # The eviction policy of the cos/sin loads ("" or "evict_last": every head reuses them). The same
    # sweep had "evict_last" within 1 point of "" at 1024 elements.
    evict_tables: str = ""

    def __post_init__(self) -> None:
        if self.partner not in ("wrap", "halves"):
            raise ValueError(f"FlatConfig.partner must be 'wrap' or 'halves', got {self.partner!r}")
        if self.evict_tables not in ("", "evict_first", "evict_last"):
            raise ValueError(f"FlatConfig.evict_tables: no eviction policy {self.evict_tables!r}")
        _positive(self, "elements", "num_warps")


@dataclass(frozen=True)
class RopeConfig:
    """Which kernel rotates q and k, and each kernel's launch config (hashable: the plan cache's key)."""

    # The kernel for both pairings wherever q, k and their outputs are dense in (B, H, T, D) or
    # (B, T, H, D) order. benchmarks/results/probes/rope/probe_rope_pairs_h200.log (H200, 2026-11-28): the
    # flat kernel led in three of four layouts (rotate-half (B, H, T, D) 81.6 / 83.3% against the tile
    # kernel's 75.1 / 77.8; interleaved (B, T, H, D) 88.1 / 86.2 against the per-token kernel's 84.6 /
    # 84.6) and was within 1.4 points of the best tile form in the fourth. "tile" or "token" runs that
    # kernel for every layout.
    schedule: str = "flat"
    # Where the flat kernel does not apply (views of a fused QKV projection, sliced rows). Interleaved:
    # the per-token kernel, 83.2 / 83.1% against the tile kernel's 78.9 / 79.0 on (B, H, T, D) in the
    # same H200 probe. Rotate-half: the tile kernel, whose best pair form led the per-token kernel in both
    # layouts there ("split" 78.5 / 77.9 against 77.0 / 76.6 on (B, H, T, D), "halves" 82.4 / 84.2
    # against 79.8 / 79.6 on (B, T, H, D)); TileConfig's default pair form is neither (see there).
    fallback_rotate_half: str = "tile"
    fallback_interleaved: str = "token"
    tile: TileConfig = field(default_factory=TileConfig)
    token: TokenConfig = field(default_factory=TokenConfig)
    flat: FlatConfig = field(default_factory=FlatConfig)

    def __post_init__(self) -> None:
        if self.schedule not in KERNELS:
            raise ValueError(f"RopeConfig.schedule must be one of {KERNELS}, got {self.schedule!r}")
        for name in ("fallback_rotate_half", "fallback_interleaved"):
            if getattr(self, name) not in ("tile", "token"):
                raise ValueError(f"RopeConfig.{name} must be 'tile' or 'token', got {getattr(self, name)!r}")
        # Every eager launch hashes the config (the plan cache's key): once here rather than per call,
        # where the generated hash of the nested dataclasses costs about 2 us of Python.
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self))))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def fallback(self, interleaved: bool) -> str:
        """The kernel for strides the flat kernel does not take."""
        return self.fallback_interleaved if interleaved else self.fallback_rotate_half


def _positive(config: object, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{type(config).__name__}.{name} must be a positive int, got {value!r}")


DEFAULT = tuning.register("rope", RopeConfig())


def current() -> RopeConfig:
    """The rope config in force here (the innermost `tuning.override` of "rope", else DEFAULT)."""
    return tuning.current("rope")
