"""GPU kernels, memcpys and memsets of each recorded op, through CUPTI's activity API.

The native side ties GPU work to an op through CUPTI's API callbacks: every CUDA call that
launches work while the op runs (between push and pop) has its correlation id, which its kernels
carry, mapped to the op. Work a recording thread launches outside any op and outside the
recorder's own work (between ``enter`` and ``leave``) is *unclaimed*: code OpGuard did not record
(a custom extension, a raw Triton launch, a ctypes call into libcuda). It is kept in the list of
the op it followed, flagged ``"u": 1``, so an input changed behind the recorder's back can be
traced to the GPU work that ran in between. This module finds libcupti, starts collection, and
turns drained activity into the trace's per-op kernel lists.
"""

from __future__ import annotations

import glob
import os
import sys

from .. import _C


def _candidates() -> list[str]:
    """Where libcupti may be: an explicit OPGUARD_CUPTI, the NVIDIA wheels next to torch, the
    CUDA toolkit, then the dynamic loader's own search path."""
    found = [os.environ["OPGUARD_CUPTI"]] if os.environ.get("OPGUARD_CUPTI") else []
    for root in sys.path:
        found += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcupti.so*")))
        found += sorted(glob.glob(os.path.join(root, "nvidia", "*", "*", "lib", "libcupti.so*")))
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home:
            found += sorted(glob.glob(os.path.join(home, "lib64", "libcupti.so*")))
            found += sorted(
                glob.glob(os.path.join(home, "extras", "CUPTI", "lib64", "libcupti.so*"))
            )
    return [*found, "libcupti.so.13", "libcupti.so.12", "libcupti.so"]


class KernelActivity:
    """Collects the GPU activity of recorded ops. ``start()`` returns None and a reason when
    CUPTI cannot be used; recording then goes on without kernels."""

    def __init__(self) -> None:
        self.push = _C.cupti_push
        self.pop = _C.cupti_pop
        # Around the recorder's own work on a thread (fingerprints, captures); ``leave`` takes
        # the last recorded op, which unclaimed work launched afterwards follows.
        self.enter = _C.cupti_recorder_enter
        self.leave = _C.cupti_recorder_leave

    @staticmethod
    def stop_watching() -> None:
        """Recording stopped: GPU work launched from now on is no longer reported (the ops
        that launch it are not recorded either)."""
        _C.cupti_watch_unclaimed(False)

    @staticmethod
    def pause() -> None:
        """Collects nothing until :meth:`resume`: CUPTI's launch callbacks and activity records
        are turned off (outside an op-level window, launches cost what they cost unrecorded)."""
        _C.cupti_pause()

    @staticmethod
    def resume() -> None:
        """Collects again after :meth:`pause`; says on stderr when CUPTI refuses."""
        reason = _C.cupti_resume()
        if reason:
            print(
                f"opguard: GPU kernels will not be recorded from here on: {reason}", file=sys.stderr
            )

    @classmethod
    def start(cls) -> tuple[KernelActivity | None, str]:
        if not getattr(_C, "CUDA_BUILT", False):
            return None, "OpGuard was built without CUDA"
        reasons = []
        for library in _candidates():
            reason = _C.cupti_start(library)
            if not reason:
                return cls(), f"CUPTI from {library}"
            reasons.append(reason)
        return None, reasons[-1] if reasons else "libcupti not found"

    def drain(self, final: bool = False) -> list[tuple[int, bytes]]:
        """Activity collected so far as (op index, its kernel entries packed), ops in order
        (``final``: everything, then stop). Packed natively: the writer drains thousands of
        entries per step, and building them as Python objects held the GIL that long."""
        by_op = _C.cupti_drain(final)
        if final:
            _C.cupti_stop()
        return by_op
