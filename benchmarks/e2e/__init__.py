"""The pieces of benchmarks/bench_e2e.py, by concern.

    providers.py   what a row runs: the base providers, the named variants (a frozen `Variant` each) and the
                   parser of `BASE[+VARIANT...]`, which is also the row's label
    models.py      the model sizes, building a provider's model and optimizer, the device helpers
    profiling.py   where a profiled step's time goes: kernels, idle gaps, the host's phases

`python benchmarks/bench_e2e.py` stays the entry point; it puts this folder's parent on `sys.path`.
"""
