"""One way to show an exception in a report, a table cell or a log line. Imports nothing of ours."""

from __future__ import annotations

# Dynamo appends these to the errors it re-raises; the part before them is the error itself
_DYNAMO_TRAILERS = ("\n\nfrom user code:", "\n\nSet TORCHDYNAMO_VERBOSE")


def short_error(exc: BaseException, limit: int = 600, *, lines: int | None = None) -> str:
    """`Type: message`, cut at Dynamo's trailers, then at `lines` lines ("..." marks the cut) and at
    `limit` characters."""
    text = str(exc)
    for trailer in _DYNAMO_TRAILERS:
        text = text.split(trailer)[0]
    text = text.strip()
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if lines is not None:
        parts = text.splitlines()
        if len(parts) > lines:
            text = "\n".join(parts[:lines]) + "\n..."
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = ["short_error"]
