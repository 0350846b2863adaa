"""The pieces of benchmarks/bench_e2e.py, by concern.

    providers.py   what a row runs: the base providers, the named variants (a frozen `Variant` each) and the
                   parser of `BASE[+VARIANT...]`, which is also the row's label
    families.py    the decoder families (Llama, Qwen3, Gemma 3) and their sizes: config, parameters, step FLOPs
    batches.py     the step's batch: token ids, or packed rows of documents (`+packed`)
    models.py      building a provider's model and optimizer, the loss call, the device helpers
    generate.py    the generate() rows (prefill + greedy decode)
    targets.py     the combined target per `ours` row, the scaling efficiency under torchrun
    distributed.py FSDP2 (`+fsdp2`) and the torchrun world
    profiling.py   where a profiled step's time goes: kernels, idle gaps, the host's phases

`python benchmarks/bench_e2e.py` stays the entry point; it puts this folder's parent on `sys.path`.
"""
