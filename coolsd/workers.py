"""Work in another process while this one goes on (``coolsd demo``'s phases side by side on the cores).

``Spawned(fn, *args)`` runs ``fn(*args, tick)`` in a fresh interpreter (``python -c``: no torch, OpenMP or thread
state inherited, and unlike multiprocessing's "spawn" it never re-imports the caller's main script, so a plain
script calling ``run_demo`` needs no ``if __name__ == "__main__"`` guard); ``tick(n)`` reports n units of progress.
``ticks()`` collects the units reported so far without waiting; ``result()`` waits for the return value, raising
the worker's traceback as a ``RuntimeError``, or its exit code if it ended without an answer. ``fn`` must be
importable (defined at a module's top level) with this process's ``sys.path``.

The job goes to the worker's stdin and the messages come back on a pipe of their own (the worker's stdout and
stderr are this process's), each a plain pickle with an 8-byte length: tensors travel as bytes.
"""
from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import threading
import traceback

__all__ = ["Spawned"]

_HEADER = 8


def _send(f, msg) -> None:
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(len(data).to_bytes(_HEADER, "little"))
    f.write(data)
    f.flush()


def _recv(f):
    """The next message, or None at the end of the stream (a message cut short is the end too)."""
    head = f.read(_HEADER)
    if len(head) < _HEADER:
        return None
    n = int.from_bytes(head, "little")
    data = f.read(n)
    return pickle.loads(data) if len(data) == n else None


def _child() -> None:
    """The worker's side: read (fn, args) from stdin, run it, send the ticks and the answer on fd ``argv[1]``."""
    with os.fdopen(int(sys.argv[1]), "wb") as out:
        try:
            fn, args = pickle.load(sys.stdin.buffer)
            _send(out, ("done", fn(*args, lambda n: _send(out, ("tick", int(n))))))
        except BaseException:   # noqa: BLE001 -- every failure goes back to the parent, which raises it
            _send(out, ("error", traceback.format_exc()))


class Spawned:
    """``fn(*args, tick)`` in another process (see the module's docstring)."""

    def __init__(self, fn, *args):
        self.name = getattr(fn, "__qualname__", repr(fn))
        job = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
        r, w = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if isinstance(p, str) and p))
        try:
            self._p = subprocess.Popen([sys.executable, "-c", "from coolsd.workers import _child; _child()",
                                        str(w)], stdin=subprocess.PIPE, pass_fds=(w,), env=env)
        finally:
            os.close(w)
        self._inbox: queue.Queue = queue.Queue()
        self._end = None
        threading.Thread(target=self._write, args=(job,), daemon=True).start()   # a big job never blocks the caller
        threading.Thread(target=self._read, args=(r,), daemon=True).start()

    def _write(self, job: bytes) -> None:
        try:
            self._p.stdin.write(job)
            self._p.stdin.close()
        except (BrokenPipeError, OSError):      # the worker died first: result() reports its exit code
            pass

    def _read(self, r: int) -> None:
        with os.fdopen(r, "rb") as f:
            while (msg := _recv(f)) is not None:
                self._inbox.put(msg)
        self._inbox.put(("eof", None))

    def _take(self, msg) -> int:
        if msg[0] == "tick":
            return msg[1]
        self._end = msg
        return 0

    def ticks(self) -> int:
        """Units of progress reported since the last call; never waits."""
        n = 0
        while self._end is None:
            try:
                n += self._take(self._inbox.get_nowait())
            except queue.Empty:
                break
        return n

    def result(self, on_tick=None):
        """Wait for ``fn``'s return value; ``on_tick(n)`` is told of the progress reported meanwhile."""
        while self._end is None:
            n = self._take(self._inbox.get())
            if n and on_tick is not None:
                on_tick(n)
        kind, x = self._end
        if kind == "error":
            raise RuntimeError(f"{self.name} failed in a worker process:\n{x}")
        if kind == "eof":
            raise RuntimeError(f"{self.name}: the worker process ended (exit code {self._p.wait()}) "
                               "without returning a result")
        self._p.wait()
        return x

    def close(self) -> None:
        """Stop the worker if it still runs (after an error on this side) and reap it."""
        if self._p.poll() is None and self._end is None:
            self._p.kill()
        self._p.wait()
