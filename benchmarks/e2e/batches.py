"""The end-to-end benchmark's training batch: random token ids (seed 0) with labels = input_ids, or, for a
`+packed` row, the same ids as packed rows.

A packed row holds documents of random lengths (seed 0), each drawn uniformly from [seq / 32, seq / 4]
tokens (128 to 1024 in a row of 4096, about seven documents), the last cut to fill the row;
`position_ids` restart at 0 for each document, and each document's first label is -100, so no token is
predicted across a boundary (what transformers' DataCollatorWithFlattening makes). transformers reads the
documents from the position ids when the call has no attention_mask and no cache, so a packed row's call
passes `use_cache=False` (`Variant.call_kwargs`).
"""

from __future__ import annotations

import torch


def doc_lengths(batch: int, seq: int, seed: int = 0) -> list[list[int]]:
    """Each row's document lengths, summing to `seq` (module docstring)."""
    g = torch.Generator().manual_seed(seed)
    shortest, longest = max(2, seq // 32), max(2, seq // 4)
    rows = []
    for _ in range(batch):
        row: list[int] = []
        while sum(row) < seq:
            n = int(torch.randint(shortest, longest + 1, (), generator=g))
            row.append(min(n, seq - sum(row)))
        rows.append(row)
    return rows


def position_ids(rows: list[list[int]]) -> torch.Tensor:
    """(B, T) int64 positions restarting at 0 for each document of each row."""
    return torch.tensor([[p for n in row for p in range(n)] for row in rows])


def training_batch(vocab: int, batch: int, seq: int, dev: torch.device,
                   packed: bool = False) -> dict[str, torch.Tensor]:
    """The step's fixed batch: input_ids and labels (B, T) on `dev`, and for packed rows position_ids."""
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    if not packed:
        ids = ids.to(dev)
        return {"input_ids": ids, "labels": ids}
    positions = position_ids(doc_lengths(batch, seq))
    labels = ids.masked_fill(positions == 0, -100)
    return {"input_ids": ids.to(dev), "labels": labels.to(dev), "position_ids": positions.to(dev)}
