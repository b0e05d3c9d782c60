"""The signals that stop a run that trains: SLURM's pre-emption and time-limit warning (SIGTERM, SIGUSR1) and
submitit's own pre-emption signal (USR2) are recorded while a step runs; the loop finishes the step, checkpoints,
then hands over to submitit's handler (requeue) or ends. Imports no torch."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def stop_signals() -> Iterator[tuple[list[int], dict[int, Any]]]:
    """SIGTERM/SIGUSR1 (SLURM pre-emption, a time-limit warning), and submitit's own pre-emption signal (USR2)
    when it installed a handler, recorded (not acted on) while the loop runs: the loop finishes the step,
    checkpoints, then hands over to submitit's handler (`previous`: requeue). The handlers are put back after."""
    signalled: list[int] = []
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        sigs = [signal.SIGTERM, signal.SIGUSR1]
        preempt = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)
        if preempt is not None and callable(signal.getsignal(preempt)) and preempt not in sigs:
            sigs.append(preempt)
        for sig in sigs:
            previous[sig] = signal.signal(sig, lambda s, _f: signalled.append(s))
    try:
        yield signalled, previous
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
