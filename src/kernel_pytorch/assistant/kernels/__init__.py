"""Kernel efficiency and the compile verdict, from the eager and the compiled model timed and profiled.

`profile` (the timed and profiled runs, `RuntimeProfile`), `profiler` (one run under torch.profiler),
`traces` (the runs' Chrome traces merged), `stats` (profiler events to kernel statistics), `efficiency`
(the analysis), `verdict` (compile or not, from the measured steps), `sdpa` (attention calls that lost
their fast path, timed as made and as fixed)."""
