"""Locations: the line executed, in the user's code or a library's with the user's frame that led there,
never in the analyser's own files; a decorated forward located at its own `def`; the function holding a
line named as its source names it."""

from __future__ import annotations

import functools
import inspect
import traceback
from pathlib import Path
from typing import Any

import rich.console
import torch
from torch import Tensor, nn

from kernel_pytorch.assistant import context as analyser_file
from kernel_pytorch.assistant.locate import (
    definition_location,
    error_location,
    forward_owner,
    function_name,
    is_library_file,
    is_user_file,
    location_of,
    user_location,
)

HERE = str(Path(__file__).resolve())
LIBRARY = inspect.getsourcefile(rich.console) or ""  # an installed package's file, as transformers' would be
LINEAR = inspect.getsourcefile(nn.Linear) or ""


def _marker(name: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# LOC:{name}"))


def _frame(file: str, line: int, name: str) -> traceback.FrameSummary:
    return traceback.FrameSummary(file, line, name)


def _wraps(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return fn(self, *args, **kwargs)

    return wrapper


class Decorated(nn.Module):
    @_wraps
    @torch.no_grad()
    def forward(self, x: Tensor) -> Tensor:  # LOC:decorated-def
        return x * 2


class CallsLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x)  # LOC:calls-linear


def test_decorated_forward_is_located_at_its_own_def_line() -> None:
    loc = definition_location(Decorated())
    assert loc is not None
    assert Path(loc.file).resolve() == Path(HERE) and loc.line == _marker("decorated-def")
    assert loc.function == "forward" and (loc.code or "").startswith("def forward(")


def test_the_analysers_files_are_never_user_code_but_libraries_are() -> None:
    assert not is_user_file(str(Path(analyser_file.__file__)))
    assert is_user_file(HERE) and not is_library_file(HERE)
    assert is_user_file(LIBRARY) and is_library_file(LIBRARY)
    assert not is_user_file(LINEAR) and is_library_file(LINEAR)


def test_a_library_frame_names_the_user_frame_that_led_there() -> None:
    user = _frame(HERE, _marker("calls-linear"), "forward")
    loc = user_location([user, _frame(LIBRARY, 10, "print")])
    assert loc is not None and loc.file == LIBRARY and loc.line == 10
    assert loc.via is not None and loc.via.file == HERE and loc.via.line == _marker("calls-linear")
    assert loc.via.code == "return self.proj(x)  # LOC:calls-linear"
    assert loc.to_dict()["via"]["line"] == loc.via.line
    # a location in the user's own code needs no `via`
    own = user_location([user])
    assert own is not None and own.via is None


def test_library_frames_fall_back_to_the_models_own_forward() -> None:
    """An HF model: every frame is a library's; `via` is the frame in the model class's forward."""
    model = nn.Sequential(nn.Identity())  # a model whose forward is library code, as transformers' are
    lines, first = inspect.getsourcelines(nn.Sequential.forward)
    call = first + next(i for i, text in enumerate(lines) if "module(input)" in text)
    container = LINEAR.replace("linear.py", "container.py")
    loc = user_location([_frame(container, call, "forward"), _frame(LIBRARY, 10, "print")], model)
    assert loc is not None and loc.file == LIBRARY
    assert loc.via is not None and loc.via.line == call and loc.via.function == "forward"
    assert user_location([_frame(LIBRARY, 10, "print")], model).via is None  # type: ignore[union-attr]


def test_error_inside_torch_is_located_at_torchs_forward_not_the_analyser() -> None:
    model = nn.Linear(16, 16)
    error = analyser_file.AnalysisContext(model, (torch.randn(2, 8),)).eager.error  # raised under the analyser
    assert error is not None
    loc = error_location(error, model)
    assert loc is not None and Path(loc.file).name == "linear.py" and loc.function == "forward"
    assert forward_owner(model, loc) == "torch.nn.Linear"


def test_error_in_user_forward_is_located_at_the_user_line() -> None:
    model = CallsLinear()
    try:
        model(torch.randn(2, 8))
    except RuntimeError as exc:
        loc = error_location(exc, model)
    assert loc is not None and loc.line == _marker("calls-linear") and loc.via is None


def _as_module(fn: Any) -> nn.Module:
    """`fn` turned into a module, as transformers' hub-kernel decorator turns `apply_rotary_pos_emb`."""

    class Func(nn.Module):
        def forward(self, *args: Any) -> Any:
            return fn(*args)

    return Func()


@_as_module
def rotate(x: Tensor) -> Tensor:
    return torch.cat((-x[..., 1:], x[..., :1]), dim=-1)  # LOC:rotate


class Outer(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        def inner(y: Tensor) -> Tensor:
            return y * 2  # LOC:inner

        return inner(x) + 1  # LOC:outer


def test_function_name_as_the_source_names_it() -> None:
    def at(marker: str, function: str) -> str | None:
        return function_name(location_of(HERE, _marker(marker), function))  # type: ignore[arg-type]

    assert at("rotate", "rotate") == "rotate"  # not "Func": the decorator's module
    assert at("outer", "forward") == "Outer.forward"
    assert at("inner", "inner") == "Outer.forward.inner"
    assert function_name(location_of(HERE, 1)) is None  # type: ignore[arg-type]  # the module docstring
