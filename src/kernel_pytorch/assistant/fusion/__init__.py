"""Fusion opportunities: the patterns kernel_pytorch's components implement, found in the traced graphs.

`fusion` (the analysis: one finding per pattern with its locations and bytes saved), `patterns` (the
`find_*` matchers), `graph` (a captured FX graph indexed for matching)."""
