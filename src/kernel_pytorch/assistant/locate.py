"""Locating user code: which file:line of the user's code a graph break, a guard or an error points at.

Torch's own files, the standard library and synthetic frames are never the answer: a finding points at
the line the user can change.
"""

from __future__ import annotations

import inspect
import linecache
import os
import re
import sysconfig
import traceback
from collections.abc import Sequence

import torch
from torch import nn

from kernel_pytorch.assistant.findings import Location

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_STDLIB_DIRS = tuple(
    os.path.realpath(p) + os.sep for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)


def is_user_file(filename: str) -> bool:
    """False for torch's own files, the standard library and synthetic frames (`<frozen ...>`)."""
    if not filename or filename.startswith("<"):
        return False
    real = os.path.realpath(filename)
    if filename.startswith(_TORCH_DIR) or real.startswith(os.path.realpath(_TORCH_DIR)):
        return False
    return not any(real.startswith(d) and "site-packages" not in real[len(d) :] for d in _STDLIB_DIRS)


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


def user_location(frames: Sequence[traceback.FrameSummary]) -> Location | None:
    """The innermost frame of `frames` in the user's code, else the innermost frame at all."""
    for fr in reversed(frames):
        if is_user_file(fr.filename):
            return location_of(fr.filename, fr.lineno, fr.name)
    if frames:
        fr = frames[-1]
        return location_of(fr.filename, fr.lineno, fr.name)
    return None


_FROM_USER_CODE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def error_location(exc: BaseException) -> Location | None:
    """Where in the user's code `exc` arose: Dynamo's "from user code" frames, else the traceback."""
    frames = getattr(exc, "real_stack", None)
    if frames:
        loc = user_location(list(frames))
        if loc is not None and is_user_file(loc.file):
            return loc
    hits = [m for m in _FROM_USER_CODE.finditer(str(exc)) if is_user_file(m.group(1))]
    if hits:
        m = hits[-1]
        return location_of(m.group(1), int(m.group(2)), m.group(3))
    return user_location(traceback.extract_tb(exc.__traceback__)) if exc.__traceback__ else None


def definition_location(module: nn.Module) -> Location | None:
    """The `def forward` line of the module's class."""
    fn = type(module).forward
    try:
        file = inspect.getsourcefile(fn)
        _, line = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    return location_of(file, line, "forward") if file else None
