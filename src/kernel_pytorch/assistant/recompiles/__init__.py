"""Recompilations: the shapes and scalars the model meets in use, each recompile's cause, its verified fix.

`recompiles` (the analysis), `sweep` (the calls compiled once with the trace backend, every compile
recorded), `causes` (which guard failed and why), `fixes` (what to mark dynamic, tried by a re-run),
`cause_findings` (one finding per cause), `generate` (the decode loop of a Hugging Face `generate()`)."""
