"""Ctrl-C (SIGINT) or SIGTERM during training: finish the step under way, save a checkpoint
and the model, and stop; a second signal stops at once.

A training step of a real model on a CPU takes about a minute, and a kill loses every step
since the last checkpoint. The handlers are installed for SIGINT too when the process
inherited it ignored (a job started in the background by a shell), so Ctrl-C / `kill -INT`
always reach it. Before the first step there is nothing to save: the signal stops at once.

    stop = StopOnSignal()
    with stop.installed():
        trainer(..., callbacks=[stop]).train()
    if stop.signal_name: ...   # stopped early, exit 128 + signal number
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

from transformers import TrainerCallback

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnSignal(TrainerCallback):
    def __init__(self, stream=None):
        self.stream = stream
        self.signum: int | None = None
        self._training = False

    @property
    def signal_name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum else None

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by a signal: 128 + its number."""
        return 128 + self.signum if self.signum else 0

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopOnSignal]:
        """The handlers for the block's duration (main thread only: elsewhere Python cannot
        install them, and the block runs as it would without)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if not self._training or self.signum is not None:  # nothing to save, or asked twice
            signal.signal(signum, signal.SIG_DFL)  # the default action: end the process now
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        print(f"{name}: stopping after this step, saving a checkpoint and the model "
              f"({name} again stops at once)", file=self.stream or sys.stderr, flush=True)

    def on_train_begin(self, args, state, control, **kw):
        self._training = True

    def on_step_end(self, args, state, control, **kw):
        if self.signum is not None:
            control.should_save = True  # a checkpoint: `--resume` continues from here
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kw):
        self._training = False
