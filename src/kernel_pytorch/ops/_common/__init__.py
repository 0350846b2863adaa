"""What every op family shares and no family owns: op registration (`register`, which reads an op's
description through `op_plan`), the eager host-time fast path behind its one switch (`fast_path`), the
generic launch helpers (`launch`), row schedules and tile loads for the row-wise kernels (`rows`,
`tiles`, `row_view`), the fixed-order weight-gradient partials (`partials`), and two small registered
building blocks the losses and the MLP use (`scale`: a gradient times the upstream gradient;
`gemm_into`: a GEMM into an existing buffer). No op math lives here."""
