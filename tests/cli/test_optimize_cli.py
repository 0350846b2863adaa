"""`kernel-pytorch optimize FACTORY [--save DIR]`: report, exit codes, the saved weights and manifest."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from kernel_pytorch.cli.main import main

FACTORY = textwrap.dedent('''
    import torch
    from torch import nn


    class Model(nn.Module):
        def __init__(self, dim=16):
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.proj = nn.Linear(dim, dim)
            self.out = nn.RMSNorm(dim)

        def forward(self, x):
            return self.out(self.proj(self.norm(x)))


    def make():
        return Model(), (torch.randn(4, 16),)
''')


@pytest.fixture()
def factory(tmp_path: Path) -> str:
    path = tmp_path / "model.py"
    path.write_text(FACTORY)
    return f"{path}:make"


def test_prints_report_and_validation(factory: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["optimize", factory, "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "optimize: 2 modules replaced" in out and "correctness_check: PASS" in out


def test_json_and_save(factory: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save = tmp_path / "saved"
    assert main(["optimize", factory, "--seeds", "1", "--json", "--save", str(save)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["counts"] == {"torch_layer_norm": 1, "torch_rms_norm": 1}
    manifest = json.loads((save / "kernel_pytorch.json").read_text())
    assert manifest["report"]["counts"] == report["counts"] and manifest["metadata"]["factory"] == factory
    assert sorted(s["rule"] for s in manifest["swaps"]) == ["torch_layer_norm", "torch_rms_norm"]
    from safetensors.torch import load_file

    from kernel_pytorch.cli._factory import load_factory

    torch.manual_seed(0)  # the CLI builds the model under seed 0: the same weights
    original, _ = load_factory(factory)()
    saved = load_file(str(save / "model.safetensors"))
    assert saved.keys() == original.state_dict().keys()
    assert all(torch.equal(saved[k], v) for k, v in original.state_dict().items())
    import kernel_pytorch

    loaded = kernel_pytorch.load(save, load_factory(factory))  # rebuilt from the factory, swaps re-applied
    assert type(loaded.norm).__module__.startswith("kernel_pytorch.")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in original.state_dict().items())


def test_bad_factory_exits_2(tmp_path: Path) -> None:
    assert main(["optimize", str(tmp_path / "missing.py")]) == 2


def test_unknown_component_exits_2(factory: str) -> None:
    assert main(["optimize", factory, "--components", "nope"]) == 2


EXTRA = FACTORY + textwrap.dedent('''

    def get_extra_inputs():
        return [(torch.randn(2, 16),), (torch.randn(7, 16),)]
''')


def test_extra_inputs_mark_the_varying_dims(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.py"
    path.write_text(EXTRA)
    assert main(["optimize", f"{path}:make", "--seeds", "1", "--json", "--save", str(tmp_path / "out")]) == 0
    report = json.loads(capsys.readouterr().out)
    marked = next(s for s in report["compile"] if s["name"] == "mark_dynamic")
    assert marked["measured"]["calls"] == 3, marked
    manifest = json.loads((tmp_path / "out" / "kernel_pytorch.json").read_text())
    assert manifest["dynamic_dims"] == report["dynamic_dims"]


def test_bad_extra_inputs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.py"
    path.write_text(FACTORY + "\n\ndef get_extra_inputs():\n    return 3\n")
    assert main(["optimize", f"{path}:make"]) == 2
    assert "get_extra_inputs() must return a list" in capsys.readouterr().err


HAND_WRITTEN = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Model(nn.Module):
        def __init__(self, dim=16):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))
            self.gate, self.up = nn.Linear(dim, 32), nn.Linear(dim, 32)

        def forward(self, x):
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
            return F.silu(self.gate(h)) * self.up(h)


    def make():
        return Model(), (torch.randn(4, 16),)
''')


def test_rewrite_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "hand.py"
    path.write_text(HAND_WRITTEN)
    assert main(["optimize", f"{path}:make", "--seeds", "1", "--compile", "off", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rewrites"] == []
    assert main(["optimize", f"{path}:make", "--seeds", "1", "--compile", "off", "--json", "--rewrite"]) == 0
    rewrites = json.loads(capsys.readouterr().out)["rewrites"]
    assert [(r["kind"], r["status"]) for r in rewrites] == [("rms-norm", "applied"), ("gated-act", "applied")]
    line = next(i for i, text in enumerate(HAND_WRITTEN.splitlines(), 1) if "rsqrt" in text)
    assert rewrites[0]["location"] == f"{path}:{line}"
    assert main(["optimize", f"{path}:make", "--seeds", "1", "--compile", "off", "--json", "--rewrite", "norm"]) == 0
    assert [r["kind"] for r in json.loads(capsys.readouterr().out)["rewrites"]] == ["rms-norm"]
