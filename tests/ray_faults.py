"""A fault planted in a Ray cluster's workers by tests/test_ray.py, through Ray's
``worker_process_setup_hook``: the first comparison of rank :data:`RANK_ENV` kills its own
process (SIGKILL, as the kernel's out-of-memory killer or an operator would), once per marker
file, so that Ray must run the task again."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

MARKER_ENV = "OPGUARD_TEST_KILL_MARKER"  # created by the process killed
RANK_ENV = "OPGUARD_TEST_KILL_RANK"


def kill_first_comparison() -> None:
    """Wraps :func:`opguard.distributed.tasks.compare` in this worker (tasks are loaded by
    name, so the wrapper is what runs)."""
    from opguard.distributed import tasks

    compare = tasks.compare

    def killed_once(job: Any) -> Any:
        marker = Path(os.environ[MARKER_ENV])
        if job.pair.reported == int(os.environ[RANK_ENV]):
            try:
                marker.touch(exist_ok=False)
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return compare(job)

    tasks.compare = killed_once  # type: ignore[assignment]
