"""Locating code: which file:line a graph break, a guard or an error points at.

A location is the innermost frame a reader can open: the user's code, or a library's (transformers,
timm, torch's own modules) when that is where it happened. Then `Location.via` names the nearest frame
of the user's code, or of the model class's forward, whose call led there. The standard library,
synthetic frames and the analyser's own files are never the answer.
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache
import os
import re
import sysconfig
import traceback
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn

from kernel_pytorch.assistant.findings import Location

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_TORCH_REAL = os.path.realpath(_TORCH_DIR) + os.sep
_STDLIB_DIRS = tuple(
    os.path.realpath(p) + os.sep for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)
# kernel_pytorch: its model code (modules, models, ops) is library code a model runs; the rest (this
# analyser, validation, benchmarks, the CLI) calls the model and is never where something happened
_PACKAGE_DIR = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_PACKAGE_MODEL_CODE = tuple(
    os.path.join(_PACKAGE_DIR, d) + os.sep for d in ("nn", "models", "functional", "ops", "reference", "optimize")
)
_INSTALLED = re.compile(r"[\\/](site|dist)-packages[\\/]")


def _is_torch(filename: str) -> bool:
    return filename.startswith(_TORCH_DIR) or os.path.realpath(filename).startswith(_TORCH_REAL)


def _is_analyser(real: str) -> bool:
    return real.startswith(_PACKAGE_DIR) and not real.startswith(_PACKAGE_MODEL_CODE)


def is_user_file(filename: str) -> bool:
    """False for torch's own files, the standard library, synthetic frames (`<frozen ...>`) and the
    analyser's own files; True for the user's code and installed libraries (transformers, timm)."""
    if not filename or filename.startswith("<") or _is_torch(filename):
        return False
    real = os.path.realpath(filename)
    if _is_analyser(real):
        return False
    return not any(real.startswith(d) and "site-packages" not in real[len(d) :] for d in _STDLIB_DIRS)


def is_library_file(filename: str) -> bool:
    """True for code the user did not write but the model runs: torch, installed packages
    (site-packages: transformers, timm, torchvision) and kernel_pytorch's own modules."""
    if not filename or filename.startswith("<"):
        return False
    if _is_torch(filename) or _INSTALLED.search(filename):
        return True
    real = os.path.realpath(filename)
    return real.startswith(_PACKAGE_MODEL_CODE) or bool(_INSTALLED.search(real))


_RESUME = re.compile(r"^torch_dynamo_resume_in_(\w+?)_at_\d+$")


def resumed_function(co_name: str | None) -> str | None:
    """The function a Dynamo resume frame continues after a graph break (Dynamo names the code after
    a break "torch_dynamo_resume_in_<fn>_at_<line>"); None for any other code name."""
    m = _RESUME.match(co_name) if co_name else None
    return m.group(1) if m else None


def location_of(filename: str, lineno: int | None, function: str | None = None) -> Location | None:
    """A Location with the source line read back from the file; None without a line number."""
    if lineno is None:
        return None
    code = linecache.getline(filename, lineno).strip() or None
    if function:
        function = resumed_function(function) or function
    return Location(file=filename, line=int(lineno), function=function, code=code)


def _frame_location(fr: traceback.FrameSummary) -> Location | None:
    return location_of(fr.filename, fr.lineno, fr.name)


def _innermost(frames: Sequence[traceback.FrameSummary], test: Callable[[traceback.FrameSummary], bool]) -> int | None:
    """Index of the innermost (last) frame passing `test`, or None."""
    return next((i for i in reversed(range(len(frames))) if test(frames[i])), None)


def user_location(frames: Sequence[traceback.FrameSummary], model: nn.Module | None = None) -> Location | None:
    """Where a stack points: its innermost frame in the user's code or a library's (torch excluded),
    else its innermost torch frame in a module's `forward` (the op the model called), else its
    innermost frame. A frame inside a library carries `via`: the nearest outer frame in the user's
    code, else in the forward of `model`'s class, when the stack holds one.

    Args:
        frames: outermost first, as `traceback.extract_tb` and Dynamo's user stacks give them.
        model: the model under analysis; its class's forward is where a library's stack entered.
    """
    frames = [fr for fr in frames if not _is_analyser(os.path.realpath(fr.filename or "<"))]
    i = _innermost(frames, lambda fr: is_user_file(fr.filename))
    if i is None:
        i = _innermost(frames, lambda fr: fr.name == "forward" and _is_torch(fr.filename))
    if i is None and frames:
        i = len(frames) - 1
    if i is None:
        return None
    loc = _frame_location(frames[i])
    if loc is None or not is_library_file(loc.file):
        return loc
    outer = frames[:i]
    j = _innermost(outer, lambda fr: is_user_file(fr.filename) and not is_library_file(fr.filename))
    if j is None and model is not None:
        j = _innermost(outer, lambda fr: _in_forward_of(type(model), fr.filename, fr.lineno))
    via = _frame_location(outer[j]) if j is not None else None
    if via is None or (via.file, via.line) == (loc.file, loc.line):
        return loc
    return Location(loc.file, loc.line, loc.function, loc.code, via=via)


@functools.lru_cache(maxsize=512)
def _forward_code(cls: type) -> tuple[str, int, int] | None:
    """(file, first line, last line) of `cls.forward` unwrapped from its decorators."""
    try:
        fn = inspect.unwrap(cls.forward)  # type: ignore[attr-defined]
        file = inspect.getsourcefile(fn)
        lines, first = inspect.getsourcelines(fn)
    except (AttributeError, OSError, TypeError, ValueError):
        return None
    return (os.path.realpath(file), first, first + len(lines) - 1) if file else None


def _in_forward_of(cls: type, filename: str | None, lineno: int | None) -> bool:
    span = _forward_code(cls)
    if span is None or not filename or lineno is None:
        return False
    return os.path.realpath(filename) == span[0] and span[1] <= lineno <= span[2]


def _module_types(model: nn.Module) -> Iterator[type]:
    seen: set[type] = set()
    for m in model.modules():
        if type(m) not in seen:
            seen.add(type(m))
            yield type(m)


def forward_owner(model: nn.Module, loc: Location) -> str | None:
    """The class among `model`'s modules whose forward holds `loc`, as a reader names it
    ("torch.nn.Linear", "LlamaAttention"), or None."""
    for cls in _module_types(model):
        if _in_forward_of(cls, loc.file, loc.line):
            public = getattr(nn, cls.__name__, None) is cls and cls.__module__.startswith("torch.")
            return f"torch.nn.{cls.__name__}" if public else cls.__qualname__
    return None


@functools.lru_cache(maxsize=64)
def _functions(source: str) -> tuple[tuple[int, int, str], ...]:
    """(`def` line, last line, qualified name) of every function in `source`, methods named through
    their classes ("LlamaAttention.forward") and nested functions through the outer one."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    out: list[tuple[int, int, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    out.append((child.lineno, child.end_lineno or child.lineno, name))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return tuple(out)


def function_name(loc: Location) -> str | None:
    """The function holding `loc`'s line as its source names it: "LlamaAttention.forward" for a
    method, "apply_rotary_pos_emb" for a function; None outside any function or without the source.
    Read from the source, so a function that a decorator turned into an object (a module, a wrapper)
    keeps its own name."""
    found = [f for f in _functions("".join(linecache.getlines(loc.file))) if f[0] <= loc.line <= f[1]]
    if not found:
        return None
    name = max(found)[2]  # the innermost: the last to start
    own = loc.function
    if own and not own.startswith("<") and name.rsplit(".", 1)[-1] != own:
        return own  # the source changed since the run, or a frame the file does not show
    return name


def describe(loc: Location) -> str:
    """`file.py:line` with the file's base name, for a sentence."""
    return f"{os.path.basename(loc.file)}:{loc.line}"


_FROM_USER_CODE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def error_location(exc: BaseException, model: nn.Module | None = None) -> Location | None:
    """Where `exc` arose: Dynamo's "from user code" frames, else the traceback (see `user_location`)."""
    frames = getattr(exc, "real_stack", None)
    if frames:
        loc = user_location(list(frames), model)
        if loc is not None and is_user_file(loc.file):
            return loc
    hits = [m for m in _FROM_USER_CODE.finditer(str(exc)) if is_user_file(m.group(1))]
    if hits:
        return user_location([traceback.FrameSummary(m.group(1), int(m.group(2)), m.group(3)) for m in hits], model)
    return user_location(traceback.extract_tb(exc.__traceback__), model) if exc.__traceback__ else None


def definition_location(module: nn.Module) -> Location | None:
    """The `def forward` line of the module's class: file and line of the same function, the one a
    decorator (`functools.wraps`, transformers' `can_return_tuple`) wraps, not the decorator's."""
    try:
        fn = inspect.unwrap(type(module).forward)
        file = inspect.getsourcefile(fn)
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError, ValueError):
        return None
    # getsourcelines starts at the first decorator; the finding points at the `def` itself
    offset = next((i for i, text in enumerate(lines) if re.match(r"\s*(async\s+)?def\s", text)), 0)
    return location_of(file, first + offset, fn.__name__) if file else None


def parse_stack(text: str) -> list[traceback.FrameSummary]:
    """The frames of a formatted stack (an FX node's `stack_trace`), outermost first."""
    return [
        traceback.FrameSummary(m.group(1), int(m.group(2)), m.group(3), lookup_line=False)
        for m in _FROM_USER_CODE.finditer(text)
    ]


@functools.lru_cache(maxsize=512)
def _class_files(cls: type) -> frozenset[str]:
    """Real paths of the files defining `cls` and its forward (the unwrapped one)."""
    files = set()
    for obj in (cls, getattr(cls, "forward", None)):
        try:
            file = inspect.getsourcefile(inspect.unwrap(obj)) if obj is not None else None
        except (OSError, TypeError):
            file = None
        if file:
            files.add(os.path.realpath(file))
    return frozenset(files)


def model_files(model: nn.Module) -> frozenset[str]:
    """Real paths of the files defining the classes of `model`'s modules, torch's own excluded."""
    files: set[str] = set()
    for cls in _module_types(model):
        files.update(f for f in _class_files(cls) if not _is_torch(f))
    return frozenset(files)


def model_location(frames: Sequence[traceback.FrameSummary], model: nn.Module) -> Location | None:
    """Where a stack points in the model's own code: its innermost frame in the user's code or in a
    file defining one of the model's classes, so a library helper the model calls (transformers'
    attention integrations, loss utilities) is named by the line of the model that called it; a stack
    with no such frame falls back to `user_location`."""
    files = model_files(model)

    def mine(fr: traceback.FrameSummary) -> bool:
        if not is_user_file(fr.filename):
            return False
        return not is_library_file(fr.filename) or os.path.realpath(fr.filename) in files

    i = _innermost(frames, mine)
    return user_location(frames if i is None else frames[: i + 1], model)
