"""Nothing on stderr that the run did not cause: kernel_pytorch imports torchao only to quantize, and the
`kernel-pytorch` command hides the lines torchao logs when transformers imports it (`--verbose` shows them)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kernel_pytorch

HF_FACTORY = textwrap.dedent('''
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM


    def make():
        config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2)
        return LlamaForCausalLM(config).eval(), {"input_ids": torch.randint(0, 64, (1, 8))}
''')

NOISE = ("Failed to load", "_pytree", "Enum subclass")


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(kernel_pytorch.__file__).parents[1]), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def test_kernel_pytorch_alone_imports_no_torchao_and_prints_nothing(tmp_path: Path) -> None:
    script = textwrap.dedent('''
        import sys
        import torch
        import kernel_pytorch as kp
        from kernel_pytorch.models import build_model

        model, inputs = build_model("llama-tiny")
        model, report = kp.optimize(model, inputs, compile=False)
        kp.save(model, "saved", report=report)
        loaded = kp.load("saved", lambda: build_model("llama-tiny")[0])
        assert torch.equal(loaded(*inputs), model(*inputs))
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torchao", "transformers")))
    ''')
    proc = _run(["-c", script], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]" and proc.stderr == "", proc.stderr


def test_the_cli_on_a_hugging_face_model_prints_no_import_noise(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "hf.py").write_text(HF_FACTORY)
    proc = _run(["-m", "kernel_pytorch.cli.main", "optimize", "hf.py:make", "--no-validate", "--compile", "off"],
                tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "optimize:" in proc.stdout
    assert not [line for line in proc.stderr.splitlines() if any(n in line for n in NOISE)], proc.stderr
