"""The registered ops' signatures, with CrossEntropyOptions flattened into op arguments.

An op schema takes plain ints, floats, strings and tensors, so the options become the arguments of
CrossEntropyOptions.FLAT (`options.flat()` gives them in that order; softcap 0.0 stands for no cap).
Each op's signature is one `OpSignature`: its implementations (launch, reference, fake) take `*args`
and `parse` them back into named values with the options rebuilt, so no implementation re-spells the
list.
"""

from __future__ import annotations

import collections
import functools
import inspect
from typing import Any

from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions

OPTION_NAMES = tuple(name for name, _ in CrossEntropyOptions.FLAT)
OPTIONS = object()  # in an OpSignature's parameters: the flattened options go here
# A call's options from its flat values: the same few sets recur on every step, and building the frozen
# dataclass costs about a microsecond of the eager path's host time.
_options = functools.lru_cache(maxsize=64)(CrossEntropyOptions.from_flat)


class OpSignature:
    """One op's parameters and outputs: each parameter `(name, annotation)` or `(name, annotation,
    default)`, or OPTIONS for the flattened options. Decorating a `*args` function gives it this
    signature (register_op reads the reference's as the op schema); `parse` names a call's arguments."""

    def __init__(self, *params: Any, returns: Any) -> None:
        flat: list[tuple] = []
        for p in params:
            if p is OPTIONS:
                self._at = len(flat)  # where the options' values start
            flat.extend(CrossEntropyOptions.FLAT if p is OPTIONS else [p])
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        self.parameters = tuple(
            inspect.Parameter(p[0], kind, annotation=p[1], **({"default": p[2]} if len(p) == 3 else {}))
            for p in flat
        )
        self.returns = returns
        self._defaults = tuple(p.default for p in self.parameters)
        names = [p.name for p in self.parameters if p.name not in OPTION_NAMES]
        self._args = collections.namedtuple("Args", [*names, "options"])

    def __call__(self, fn: Any) -> Any:
        fn.__signature__ = inspect.Signature(self.parameters, return_annotation=self.returns)
        fn.__annotations__ = {**{p.name: p.annotation for p in self.parameters}, "return": self.returns}
        return fn

    def parse(self, args: tuple) -> Any:
        """The call's arguments by name (trailing defaults filled in), the options as `options`."""
        if len(args) < len(self._defaults):
            args = (*args, *self._defaults[len(args):])
        i, k = self._at, self._at + len(OPTION_NAMES)
        try:
            options = _options(*args[i:k])
        except TypeError:  # a symbolic value (traced with dynamic ints) is not hashable
            options = CrossEntropyOptions.from_flat(*args[i:k])
        return self._args(*args[:i], *args[k:], options)
