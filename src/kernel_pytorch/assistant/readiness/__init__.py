"""Compilation readiness: whether the model reaches torch.compile as one graph, and why not.

`readiness` (the analysis: one finding per graph break, failed frame and fullgraph failure),
`graph_breaks` (what kind each break is and its fix), `allow_rnn` (the recurrent-layer check)."""
