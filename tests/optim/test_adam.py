"""kernel_pytorch.optim.Adam and AdamW as drop-ins for torch.optim's: the same trajectory over several
steps (groups, dtypes, parameters without gradients, amsgrad, maximize), checkpoints both ways, hooks,
closures, the backends and their fallbacks."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from kernel_pytorch._env import log_once
from kernel_pytorch.ops import adam as K
from kernel_pytorch.optim import Adam, AdamW
from kernel_pytorch.optim import adam as optim_adam
from kernel_pytorch.tolerances import compare
from tests import _sanitize
from tests.grid import device_under_test, randn

DEV = device_under_test()


@pytest.fixture
def kernel_here(monkeypatch):
    """On a CPU-only machine the kernel path is taken anyway, through Triton's interpreter."""
    if DEV == "cpu":
        monkeypatch.setattr(optim_adam, "kernel_ready", lambda device: (True, "interpreter"))
        launch = K.adam_step

        def sanitized(*args, **kwargs):  # the kernel reads tensors through its address table
            with _sanitize.allow(*(t for ts in args[:5] if ts is not None for t in ts)):
                launch(*args, **kwargs)

        monkeypatch.setattr(K, "adam_step", sanitized)


def _model(dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.GELU(), torch.nn.Linear(33, 5))
    model.extra = torch.nn.Parameter(torch.randn(7))  # no gradient in any step: never updated, no state
    return model.to(DEV, dtype)


def _groups(model):
    return [{"params": [model[0].weight, model[0].bias, model.extra]},
            {"params": [model[2].weight, model[2].bias], "lr": 3e-3, "weight_decay": 0.0}]


def _train(model, opt, steps=4):
    torch.manual_seed(1)  # the same batch for every model trained
    x = randn(8, 16, device=DEV, dtype=next(model.parameters()).dtype)
    for _ in range(steps):
        loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _assert_models_match(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        result = compare(p, q)
        assert result.passed, result.message(name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_trajectory_matches_torch(dtype, kernel_here) -> None:
    ours, theirs = _model(dtype), _model(dtype)
    opt = AdamW(_groups(ours), lr=1e-2, weight_decay=0.05, backend="triton")
    ref = torch.optim.AdamW(_groups(theirs), lr=1e-2, weight_decay=0.05, fused=True)
    _train(ours, opt)
    _train(theirs, ref)
    _assert_models_match(ours, theirs)
    assert ours.extra not in opt.state and torch.equal(ours.extra, theirs.extra)
    assert float(opt.state[ours[0].weight]["step"]) == 4.0


@pytest.mark.parametrize("options", [{}, {"amsgrad": True}, {"maximize": True}, {"decoupled_weight_decay": True}],
                         ids=["adam", "amsgrad", "maximize", "decoupled"])
def test_adam_trajectory_matches_torch(options, kernel_here) -> None:
    ours, theirs = _model(), _model()
    opt = Adam(_groups(ours), lr=1e-2, weight_decay=0.05, backend="triton", **options)
    ref = torch.optim.Adam(_groups(theirs), lr=1e-2, weight_decay=0.05, fused=True, **options)
    _train(ours, opt)
    _train(theirs, ref)
    _assert_models_match(ours, theirs)
    assert set(opt.state[ours[0].weight]) == set(ref.state[theirs[0].weight])  # amsgrad: max_exp_avg_sq too


def test_parameters_with_their_own_step_counts(kernel_here) -> None:
    """A parameter that missed steps has a smaller step: its bias correction is its own."""
    ours, theirs = _model(), _model()
    opt = AdamW(ours.parameters(), lr=1e-2, backend="triton")
    ref = torch.optim.AdamW(theirs.parameters(), lr=1e-2, fused=True)
    x = randn(8, 16, device=DEV)
    for i in range(3):
        for model, o in ((ours, opt), (theirs, ref)):
            model[2].weight.requires_grad_(i != 1)  # the last layer's weight skips step 2
            model(x).square().mean().backward()
            o.step()
            o.zero_grad(set_to_none=True)
    assert float(opt.state[ours[2].weight]["step"]) == 2.0
    _assert_models_match(ours, theirs)


def test_checkpoints_load_both_ways(kernel_here) -> None:
    a, b, c = _model(), _model(), _model()
    ours = AdamW(a.parameters(), lr=1e-2)
    _train(a, ours, steps=2)
    theirs = torch.optim.AdamW(b.parameters(), lr=1e-2, fused=True)  # its steps live on the device
    b.load_state_dict(a.state_dict())
    theirs.load_state_dict(copy.deepcopy(ours.state_dict()))  # as from a file: no tensor shared
    assert set(theirs.state_dict()["state"][1]) == set(ours.state_dict()["state"][1]) == {
        "step", "exp_avg", "exp_avg_sq"}
    _train(a, ours, steps=2)
    _train(b, theirs, steps=2)
    _assert_models_match(a, b)
    back = AdamW(c.parameters(), lr=1e-2, backend="triton")
    c.load_state_dict(b.state_dict())
    back.load_state_dict(copy.deepcopy(theirs.state_dict()))
    _train(c, back, steps=1)
    _train(b, theirs, steps=1)
    _assert_models_match(c, b)


def test_is_a_torch_adamw_with_hooks_closure_and_scheduler(kernel_here) -> None:
    model = _model()
    opt = AdamW(model.parameters(), lr=1e-2, backend="triton")
    assert isinstance(opt, torch.optim.AdamW)
    calls = []
    opt.register_step_pre_hook(lambda *a: calls.append("pre"))
    opt.register_step_post_hook(lambda *a: calls.append("post"))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x = randn(4, 16, device=DEV)

    def closure():
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        return loss

    loss = opt.step(closure)
    sched.step()
    assert isinstance(loss, torch.Tensor) and calls == ["pre", "post"]
    assert opt.param_groups[0]["lr"] == pytest.approx(5e-3)


def test_what_the_kernel_does_not_take_falls_back(caplog, kernel_here) -> None:
    """A transposed (non-contiguous) parameter: torch's step, said once; backend='triton' raises, and so
    does an option only torch's step has."""
    log_once.cache_clear()
    torch.manual_seed(0)
    ours = torch.nn.Parameter(torch.randn(6, 5, device=DEV).t())
    theirs = torch.nn.Parameter(ours.detach().clone())
    x = randn(3, 5, device=DEV)
    opt = AdamW([ours], lr=1e-2)
    ref = torch.optim.AdamW([theirs], lr=1e-2)
    with caplog.at_level(logging.INFO, logger="kernel_pytorch"):
        for p, o in ((ours, opt), (theirs, ref)):
            for _ in range(2):
                (x @ p).square().sum().backward()
                o.step()
                o.zero_grad()
    torch.testing.assert_close(ours, theirs)
    said = [r.message for r in caplog.records if "optim.AdamW" in r.message]
    assert said == ["kernel_pytorch.optim.AdamW: a parameter, gradient or moment is not contiguous and 16-byte "
                    "aligned; using torch's AdamW step"]
    (x @ ours).sum().backward()
    with pytest.raises(ValueError, match="backend='triton' cannot run this AdamW step: a parameter"):
        AdamW([ours], backend="triton").step()
    with pytest.raises(ValueError, match="backend='triton' cannot run this Adam step: fused=True"):
        _train(_model(), Adam(_model().parameters(), fused=True, backend="triton"), steps=1)


def test_backend_torch_is_torch_bitwise() -> None:
    ours, theirs = _model(), _model()
    _train(ours, AdamW(ours.parameters(), lr=1e-2, backend="torch", foreach=False))
    _train(theirs, torch.optim.AdamW(theirs.parameters(), lr=1e-2, foreach=False))
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p, q)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        AdamW(_model().parameters(), backend="cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        Adam(_model().parameters(), backend="cuda")
    with pytest.raises(ValueError, match="Invalid learning rate"):
        AdamW(_model().parameters(), lr=-1.0)


def test_auto_uses_torch_where_the_kernel_cannot_run(monkeypatch) -> None:
    """Where the kernel cannot run (here: a CPU-only machine without the interpreter seam), auto is torch."""
    monkeypatch.setattr(optim_adam, "kernel_ready", lambda device: (False, "no CUDA device is available"))
    log_once.cache_clear()
    ours, theirs = _model(), _model()
    _train(ours, AdamW(ours.parameters(), lr=1e-2, foreach=False))
    _train(theirs, torch.optim.AdamW(theirs.parameters(), lr=1e-2, foreach=False))
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p, q)
