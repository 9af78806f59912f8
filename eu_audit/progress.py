"""How long work reports its progress: one callback type for every library function that runs models
(``record``, ``unlearn``, ``audit``, ``record_agent``, sweeps, calibration); the CLI turns it into a
progress bar, a caller into whatever it likes."""

from __future__ import annotations

from collections.abc import Callable

#: (what is being done, how many are done, how many in all)
Progress = Callable[[str, int, int], None]
