"""optimize()'s options are typed, frozen objects: `CompileOptions` (how each block compiles, what a saved
manifest records) and `ValidationOptions` (what validation checks). A bad field or a dict is refused
with a message naming the field, or the call to write instead."""

from __future__ import annotations

import dataclasses

import pytest

from kernel_pytorch.optimize import CompileOptions, optimize
from kernel_pytorch.validation import ValidationOptions
from tests.optimize import models


def test_compile_options_pass_only_what_differs_from_torch() -> None:
    assert CompileOptions().kwargs() == {}
    assert CompileOptions(backend="eager").kwargs() == {"backend": "eager"}
    opts = CompileOptions(dynamic=False, options={"allow_buffer_reuse": False})
    assert opts.kwargs() == {"dynamic": False, "options": {"allow_buffer_reuse": False}}
    assert CompileOptions.from_dict(opts.kwargs()) == opts  # a manifest's record round-trips
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.backend = "eager"  # type: ignore[misc]
    with pytest.raises(TypeError):
        opts.options["allow_buffer_reuse"] = True  # type: ignore[index]  (a read-only copy)


@pytest.mark.parametrize(("fields", "message"), [
    ({"mode": "fast"}, "CompileOptions.mode must be None or one of"),
    ({"dynamic": "yes"}, "CompileOptions.dynamic"),
    ({"fullgraph": 1}, "CompileOptions.fullgraph"),
    ({"backend": ""}, "CompileOptions.backend"),
    ({"mode": "max-autotune", "options": {"x": 1}}, "mode or options, not both"),
])
def test_compile_options_name_the_bad_field(fields: dict, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        CompileOptions(**fields)


def test_unknown_fields_are_named() -> None:
    with pytest.raises(TypeError, match="'bakend'; CompileOptions fields: backend, mode"):
        CompileOptions.from_dict({"bakend": "eager"})
    with pytest.raises(TypeError, match="no ValidationOptions field 'chek_compile'"):
        ValidationOptions().replace(chek_compile=False)
    with pytest.raises(ValueError, match="ValidationOptions.reference must be one of"):
        ValidationOptions(reference="fp32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ValidationOptions.rep_ms"):
        ValidationOptions(rep_ms=0)


def test_dicts_are_refused_with_the_call_to_write() -> None:
    model, inputs = models.stack()
    with pytest.raises(TypeError, match=r"compile_options=CompileOptions\(backend='eager'\)"):
        optimize(model, inputs, compile_options={"backend": "eager"})
    with pytest.raises(TypeError, match=r"kernel_pytorch.validation.ValidationOptions, not a dict"):
        optimize(model, inputs, validate_options={"check_gradients": False})


def test_validation_options_reach_validation() -> None:
    model, inputs = models.stack()
    assert ValidationOptions.correctness_only() == ValidationOptions(
        check_performance=False, check_compile=False, check_determinism=False)
    _, report = optimize(model, inputs, compile=False, seeds=(0,),
                         validate_options=ValidationOptions.correctness_only().replace(check_gradients=False))
    corr = report.validation.correctness_check
    assert report.passed and report.validation.performance_improvement is None
    assert not any(c.name.startswith("grad") for checks in corr.checks.values() for c in checks)
