"""Phase labels for the round's work (issue 42): ``phase("draft")`` around the code of one phase ("draft", "target",
"verify", "bookkeeping", "output"), ``event("round")`` at the start of a round. A no-op (one list test, a shared
null context) unless a counter listens (``real.decode.opcount.OpCounter``), which attributes the operations it sees
to the innermost open phase (none open: "bookkeeping")."""
from __future__ import annotations

import contextlib

__all__ = ["PHASES", "phase", "event", "listen"]

PHASES = ("draft", "target", "verify", "bookkeeping", "output")
_LISTENERS: list = []            # the active counters (each with push(name), pop(), event(name))
_NULL = contextlib.nullcontext()


class _Phase:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        for c in _LISTENERS:
            c.push(self.name)

    def __exit__(self, *exc):
        for c in _LISTENERS:
            c.pop()
        return False


def phase(name: str):
    """A context manager labelling its work as phase ``name`` for the listening counters (none: a null context)."""
    return _Phase(name) if _LISTENERS else _NULL


def event(name: str) -> None:
    """Tell the listening counters that ``name`` happened (e.g. "round": a round begins)."""
    for c in _LISTENERS:
        c.event(name)


@contextlib.contextmanager
def listen(counter):
    """Register ``counter`` for the scope."""
    _LISTENERS.append(counter)
    try:
        yield counter
    finally:
        _LISTENERS.remove(counter)
