"""GPU probe of AOTInductor packages: which model makes `aoti_load_package` fault, and where.

Usage: PYTHONPATH=src python3 benchmarks/probes/probe_aoti.py [--variants a,b,...] [--out DIR] [--jobs N]
       PYTHONPATH=src python3 benchmarks/probes/probe_aoti.py --one VARIANT --out DIR   (one variant, this process)
       PYTHONPATH=src python3 benchmarks/probes/probe_aoti.py --diagnose tiny-plain --out DIR
           where a package faults: its files and their libraries (ldd), the native backtrace of a fresh
           load (a SIGSEGV handler preloaded, built here with gcc), packages built with other
           aot_inductor settings, and the legacy aot_compile / aot_load path
       PYTHONPATH=src python3 benchmarks/probes/probe_aoti.py --toolchain tiny-plain --out DIR
           the compilers and C++ runtimes involved, and fresh loads of a package by torch's loader, by
           ours (deploy.share_cxx_runtime first) and by torch's with the system libstdc++ preloaded

Each variant builds a model on the device, exports it (kernel_pytorch.deploy.export), compiles an
AOTInductor package and loads it, first in the building process and then in a fresh one, and compares
the package's output with the model's on other sizes. Variants run in their own processes (a fault ends
only its own), several at once since the builds are CPU-bound; a variant that faults is rerun under gdb
when gdb is installed, for the native backtrace. Variants:
  tiny-plain   RMSNorm + Linear, no swaps (AOTI itself on this machine)
  tiny         the same through optimize(): kernel_pytorch::rms_norm_fwd, our Triton kernel inside
  embed        nn.Embedding through optimize(): kernel_pytorch::embedding_fwd
  mlp          a gated MLP through optimize(): kernel_pytorch::gated_act_fwd
  llama-plain  the built-in llama-tiny, no swaps
  llama        llama-tiny through optimize() (tests/deploy/test_export.py's CUDA test)
  llama-static llama-tiny through optimize(), exported with static shapes
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VARIANTS = ("tiny-plain", "tiny", "embed", "mlp", "llama-plain", "llama", "llama-static")


def build(variant: str, device: str):
    import torch
    from torch import nn

    import kernel_pytorch as kp
    from kernel_pytorch.models import build_model

    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if variant.startswith("tiny"):
        model = nn.Sequential(nn.RMSNorm(64), nn.Linear(64, 32)).to(device, dtype)
        inputs = (torch.randn(2, 5, 64, device=device, dtype=dtype),)
    elif variant == "embed":
        model = nn.Sequential(nn.Embedding(512, 64), nn.Linear(64, 32)).to(device, dtype)
        inputs = (torch.randint(0, 512, (2, 5), device=device),)
    elif variant == "mlp":
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaMLP

        model = LlamaMLP(LlamaConfig(hidden_size=64, intermediate_size=128)).to(device, dtype)
        inputs = (torch.randn(2, 5, 64, device=device, dtype=dtype),)
    else:
        model, inputs = build_model("llama-tiny", device=device, dtype=dtype)
    model = model.eval()
    if not variant.endswith("-plain"):
        model, report = kp.optimize(model, inputs, seeds=(0,))
        assert report.passed, report
    return model, inputs


def other_inputs(inputs):
    import torch

    (x,) = inputs
    if x.is_floating_point():
        return (torch.randn(3, 7, *x.shape[2:], device=x.device, dtype=x.dtype),)
    return (torch.randint(0, 512, (3, 7), device=x.device),)


def one(variant: str, out: Path) -> int:
    """Build, package and load `variant` here; the package is then loaded again by a fresh process."""
    faulthandler.enable()
    import torch

    from kernel_pytorch.deploy import aoti_package, export, load_package, our_ops
    from kernel_pytorch.tolerances import compare_reordered

    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    model, inputs = build(variant, device)
    program = export(model, inputs, dynamic=None if variant.endswith("static") else "auto")
    print(f"[{variant}] ops {our_ops(program)}; built + exported in {time.perf_counter() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    path = aoti_package(program, inputs, out / f"{variant}.pt2")
    print(f"[{variant}] package {path.stat().st_size / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f} s", flush=True)
    fresh = inputs if variant.endswith("static") else other_inputs(inputs)
    with torch.no_grad():
        expected = model(*fresh)
    torch.save({"x": fresh, "y": expected}, out / f"{variant}.io.pt")
    print(f"[{variant}] loading in this process", flush=True)
    runner = load_package(path)
    print(f"[{variant}] loaded; running", flush=True)
    with torch.no_grad():
        got = runner(*fresh)
    torch.cuda.synchronize() if device == "cuda" else None
    print(f"[{variant}] same process: {compare_reordered(got, expected).message('package')}", flush=True)
    return 0


SEGV_C = r"""
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>
static void on_fault(int sig) {
    void *frames[64];
    int n = backtrace(frames, 64);
    write(2, "native backtrace:\n", 18);
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}
__attribute__((constructor)) static void install(void) { signal(SIGSEGV, on_fault); signal(SIGBUS, on_fault); }
"""

SETTINGS = {  # aot_inductor settings a faulting load is retried with
    "default": {},
    "consts_object": {"aot_inductor.use_consts_asm_build": False},
    "consts_outside_so": {"aot_inductor.package_constants_in_so": False},
    "embed_kernels": {"aot_inductor.embed_kernel_binary": True},
    "no_precompiled_headers": {"aot_inductor.precompile_headers": False},
}


def build_with(variant: str, out: Path, setting: str) -> int:
    """Package `variant` with SETTINGS[setting] (no load here); the model's outputs saved beside it."""
    import torch
    from torch._inductor import aoti_compile_and_package

    from kernel_pytorch.deploy import export


    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, inputs = build(variant, device)
    program = export(model, inputs, dynamic=None)
    t0 = time.perf_counter()
    path = aoti_compile_and_package(program, package_path=str(out / f"{variant}-{setting}.pt2"),
                                    inductor_configs=SETTINGS[setting])
    print(f"[{variant} {setting}] built in {time.perf_counter() - t0:.1f} s: {path}", flush=True)
    with torch.no_grad():
        torch.save({"x": inputs, "y": model(*inputs)}, out / f"{variant}-{setting}.io.pt")
    return 0


def legacy(variant: str, out: Path) -> int:
    """torch._inductor.aot_compile to a .so, loaded by torch._export.aot_load in this process."""
    faulthandler.enable()
    import torch

    from kernel_pytorch.deploy import export
    from kernel_pytorch.tolerances import compare_reordered

    model, inputs = build(variant, "cuda")
    program = export(model, inputs, dynamic=None)
    so = torch._inductor.aot_compile(program.module(), inputs)
    print(f"[{variant} legacy] built {so}", flush=True)
    runner = torch._export.aot_load(so, "cuda")
    with torch.no_grad():
        got, want = runner(*inputs), model(*inputs)
    print(f"[{variant} legacy] {compare_reordered(got, want).message('aot_load')}", flush=True)
    return 0


def diagnose(variant: str, out: Path, timeout: float) -> None:
    import zipfile

    me = [sys.executable, __file__, "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    handler = out / "segv_bt.so"
    done = subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(handler), "-x", "c", "-"], input=SEGV_C,
                          capture_output=True, text=True)
    print(f"== segv handler: gcc rc {done.returncode} {done.stderr[-500:]}", flush=True)

    def build_one(setting: str) -> tuple[str, int, str]:
        d = subprocess.run(me + ["--build", variant, "--setting", setting], capture_output=True, text=True,
                           env=env, timeout=timeout)
        return setting, d.returncode, (d.stdout + d.stderr)[-1500:]

    with ThreadPoolExecutor(len(SETTINGS) + 1) as pool:
        legacy_job = pool.submit(lambda: subprocess.run(me + ["--legacy", variant], capture_output=True, text=True,
                                                        env={**env, "PYTHONFAULTHANDLER": "1"}, timeout=timeout))
        builds = list(pool.map(build_one, SETTINGS))
        lg = legacy_job.result()
    print(f"== legacy aot_compile + aot_load: rc {lg.returncode}\n{(lg.stdout + lg.stderr)[-2500:]}", flush=True)
    for setting, rc, tail in builds:
        print(f"== build {setting}: rc {rc}\n{tail if rc else tail[-300:]}", flush=True)
        pkg = out / f"{variant}-{setting}.pt2"
        if rc or not pkg.exists():
            continue
        if setting == "default":
            unpacked = out / "unpacked"
            with zipfile.ZipFile(pkg) as z:
                print("files:\n" + "\n".join(f"  {i.file_size:10d} {i.filename}" for i in z.infolist()), flush=True)
                z.extractall(unpacked)
            for so in unpacked.rglob("*.so"):
                ld = subprocess.run(["ldd", str(so)], capture_output=True, text=True)
                print(f"ldd {so.name}:\n{ld.stdout}{ld.stderr}", flush=True)
        load_env = {**env, "LD_PRELOAD": str(handler)} if handler.exists() else env
        d = subprocess.run(me + ["--fresh", f"{variant}-{setting}"], capture_output=True, text=True, env=load_env,
                           timeout=timeout)
        print(f"== fresh load {setting}: rc {d.returncode}\n{(d.stdout + d.stderr)[-4000:]}", flush=True)


def _sh(cmd: str) -> str:
    done = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    return (done.stdout + done.stderr).strip()


def toolchain(variant: str, out: Path, timeout: float) -> None:
    """Is the loader's fault a C++ runtime mismatch? The compilers and the libstdc++ the process has; a
    default package, its dynamic section and C++ runtime symbols (defined in it: a static libstdc++);
    then fresh loads of it by torch's aoti_load_package, by kernel_pytorch.deploy.load_package (which
    makes the process's libstdc++ global first: deploy.share_cxx_runtime), and by torch's loader with
    the system libstdc++ preloaded."""
    import zipfile

    me = [sys.executable, __file__, "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    print("== toolchain", flush=True)
    for cmd in ("which gcc g++ c++ clang++", "g++ --version | head -1", "echo CXX=$CXX CC=$CC",
                "${CXX:-g++} --version | head -1", "readlink -f $(g++ -print-file-name=libstdc++.so.6)",
                "strings /lib/x86_64-linux-gnu/libstdc++.so.6 | grep -E '^GLIBCXX_3[.]4[.][0-9]+$' "
                "| sort -V | tail -1"):
        print(f"$ {cmd}\n{_sh(cmd)}", flush=True)
    probe = ("import torch, torch._inductor.cpp_builder as b; print('cxx11 abi', torch._C._GLIBCXX_USE_CXX11_ABI); "
             "print('inductor compiler', b.get_cpp_compiler()); "
             "print('\\n'.join(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libstdc++' in l})))")
    print(f"$ python: torch's process\n{_sh(sys.executable + ' -c ' + repr(probe))}", flush=True)
    done = subprocess.run(me + ["--build", variant, "--setting", "default"], capture_output=True, text=True, env=env,
                          timeout=timeout)
    print(f"== build: rc {done.returncode}\n{(done.stdout + done.stderr)[-600:]}", flush=True)
    pkg = out / f"{variant}-default.pt2"
    if not pkg.exists():
        return
    unpacked = out / "unpacked-default"
    with zipfile.ZipFile(pkg) as z:
        z.extractall(unpacked)
    for so in unpacked.rglob("*.so"):
        needed = _sh(f"readelf -d {so} | grep NEEDED")
        defined = _sh(f"nm -D --defined-only {so} | grep -c -E 'St6locale|regex_traits'")
        undefined = _sh(f"nm -D --undefined-only {so} | grep -c -E 'St6locale|GLIBCXX'")
        print(f"-- {so.name} ({so.stat().st_size} bytes)\n{needed}\nC++ runtime symbols defined here: {defined}, "
              f"undefined: {undefined}", flush=True)
    preload = _sh("readlink -f $(g++ -print-file-name=libstdc++.so.6)")
    loads = [("torch's aoti_load_package", ["--raw"], env),
             ("kernel_pytorch.deploy.load_package (share_cxx_runtime)", [], env),
             ("torch's aoti_load_package, system libstdc++ preloaded", ["--raw"], {**env, "LD_PRELOAD": preload})]
    for label, extra, load_env in loads:
        try:
            d = subprocess.run(me + ["--fresh", f"{variant}-default", *extra], capture_output=True, text=True,
                               env=load_env, timeout=timeout)
            print(f"== fresh load, {label}: rc {d.returncode}\n{(d.stdout + d.stderr)[-600:]}", flush=True)
        except subprocess.TimeoutExpired:
            print(f"== fresh load, {label}: timed out", flush=True)


def fresh_load(variant: str, out: Path, raw: bool = False) -> int:
    """Load a built package in this (fresh) process and compare it with the model's saved outputs;
    `raw`: by torch's aoti_load_package itself, not kernel_pytorch.deploy.load_package."""
    if "LD_PRELOAD" not in os.environ:
        faulthandler.enable()
    import torch

    from kernel_pytorch.deploy import load_package
    from kernel_pytorch.tolerances import compare_reordered

    io = torch.load(out / f"{variant}.io.pt")
    if raw:
        import kernel_pytorch.ops  # noqa: F401  the graph may name our ops
        runner = torch._inductor.aoti_load_package(str(out / f"{variant}.pt2"))
    else:
        runner = load_package(out / f"{variant}.pt2")
    with torch.no_grad():
        got = runner(*io["x"])
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    print(f"[{variant}] fresh process: {compare_reordered(got, io['y']).message('package')}", flush=True)
    return 0


def run(variant: str, out: Path, timeout: float) -> dict:
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    me = [sys.executable, __file__, "--out", str(out)]
    record = {"variant": variant}
    for stage, args in (("build+load", ["--one", variant]), ("fresh load", ["--fresh", variant])):
        t0 = time.perf_counter()
        try:
            done = subprocess.run(me + args, capture_output=True, text=True, env=env, timeout=timeout)
            rc, text = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            rc, text = "timeout", f"{exc.stdout or ''}{exc.stderr or ''}"
        record[stage] = {"rc": rc, "s": round(time.perf_counter() - t0, 1), "tail": text[-3000:]}
        if rc != 0 and shutil.which("gdb") and rc != "timeout":
            bt = subprocess.run(["gdb", "-q", "-batch", "-ex", "run", "-ex", "bt 40", "--args", *me, *args],
                                capture_output=True, text=True, env=env, timeout=timeout)
            record[stage]["gdb"] = (bt.stdout + bt.stderr)[-6000:]
        if rc != 0:
            break
    return record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", type=Path, default=Path("aoti_probe"))
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--one")
    p.add_argument("--fresh")
    p.add_argument("--diagnose")
    p.add_argument("--build")
    p.add_argument("--setting", default="default")
    p.add_argument("--legacy")
    p.add_argument("--toolchain", help="VARIANT: is the loader's fault a C++ runtime mismatch (see toolchain())")
    p.add_argument("--raw", action="store_true", help="--fresh: load with torch's aoti_load_package itself")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        raise SystemExit(one(args.one, args.out))
    if args.fresh:
        raise SystemExit(fresh_load(args.fresh, args.out, args.raw))
    if args.build:
        raise SystemExit(build_with(args.build, args.out, args.setting))
    if args.legacy:
        raise SystemExit(legacy(args.legacy, args.out))
    if args.diagnose:
        return diagnose(args.diagnose, args.out, args.timeout)
    if args.toolchain:
        return toolchain(args.toolchain, args.out, args.timeout)
    names = [v for v in args.variants.split(",") if v]
    print(f"gdb: {shutil.which('gdb') or 'not installed'}", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        records = list(pool.map(lambda v: run(v, args.out, args.timeout), names))
    for r in records:
        for stage in ("build+load", "fresh load"):
            if stage in r:
                s = r[stage]
                print(f"== {r['variant']} {stage}: rc {s['rc']} in {s['s']} s\n{s['tail']}")
                if "gdb" in s:
                    print(f"-- gdb\n{s['gdb']}")
    print("\n== summary")
    for r in records:
        print(f"  {r['variant']:13s} " + "; ".join(f"{st} rc {r[st]['rc']}" for st in ("build+load", "fresh load")
                                                   if st in r))
    (args.out / "summary.json").write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
