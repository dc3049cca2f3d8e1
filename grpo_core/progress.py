"""Rich progress bars for long work, silent when disabled (tests, workers, CI logs)."""
from __future__ import annotations


class Bar:
    def __init__(self, total: int | None, label: str, enabled: bool = True):
        """`total` None: unknown (a count, no end: rows streamed from a source); 0: no bar."""
        self._p = None
        if enabled and total != 0:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self._p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                               TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=True)
            self._p.start()
            self._task = self._p.add_task(label, total=total, info="")

    def advance(self, k: int = 1, info: str | None = None) -> None:
        if self._p:
            self._p.update(self._task, advance=k, **({"info": info} if info is not None else {}))

    def close(self) -> None:
        if self._p:
            self._p.stop()
            self._p = None
