"""How long work reports its progress: one callback type for every library function that runs models
(``record``, ``unlearn``, ``audit``, ``record_agent``, sweeps, calibration); the CLI turns it into a
progress bar, a caller into whatever it likes."""

from __future__ import annotations

import threading
from collections.abc import Callable

#: (what is being done, how many are done, how many in all)
Progress = Callable[[str, int, int], None]


class ProgressCounter:
    """Progress over units of work (transitions, tenants), safe to tick from several threads."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.done, self.progress = total, 0, progress
        self._lock = threading.Lock()

    def tick(self, what: str) -> None:
        with self._lock:
            self.done += 1
            if self.progress:
                self.progress(what, self.done, self.total)
