"""SIGTERM while recording: the trace is closed before the process dies.

Schedulers and launchers (SLURM, Kubernetes, torchrun after a worker failed) stop a job with
SIGTERM, and by default it kills Python on the spot: the last batch of ops would be lost and the
trace would not say how it ended. While a recording is active, SIGTERM instead raises
:class:`Terminated` in the main thread (as SIGINT raises ``KeyboardInterrupt``); the session
closes the trace, then puts the default action back and sends the signal again, so the process
still dies of SIGTERM and whoever sent it sees what it expects.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any


class Terminated(SystemExit):
    """Raised in the main thread by SIGTERM during a recording. A ``SystemExit`` so that
    ``except Exception`` in the training script does not swallow it."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def _raise_terminated(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
    raise Terminated


def catch_sigterm() -> bool:
    """Turns SIGTERM into :class:`Terminated` if the program left it at its default (a
    program's own handler is its business) and this is the main thread; whether it did."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _raise_terminated)
    return True


def release_sigterm() -> None:
    """Gives SIGTERM its default action back (if :func:`catch_sigterm` took it)."""
    if signal.getsignal(signal.SIGTERM) is _raise_terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def die_of_sigterm() -> None:
    """Ends the process as the SIGTERM it received would have."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
