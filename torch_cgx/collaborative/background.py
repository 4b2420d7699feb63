"""A collaborative round run beside the training loop (``delay_grad_averaging``)."""

from __future__ import annotations

import threading
from concurrent.futures import Future

__all__ = ["in_background"]


def in_background(fn, *args) -> Future:
    """``fn(*args)`` in a daemon thread (a round stuck in a dead peer's timeout does not hold
    the interpreter's exit)."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as e:  # handed to the training thread by _collect
            future.set_exception(e)

    threading.Thread(target=run, name="torch_cgx.collaborative round", daemon=True).start()
    return future
