"""Fusion opportunities: the patterns kernel_pytorch's components implement, found in the traced graphs.

`fusion` (the analysis: one finding per pattern, function and fix, with its locations and bytes
saved), `kinds` (what each pattern kind's finding says and which component fixes it), `patterns` (the
`find_*` matchers), `graph` (a captured FX graph indexed for matching)."""
