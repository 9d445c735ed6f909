"""OpGuard: find the first operation where two PyTorch training runs stop computing the same.

``import opguard`` is cheap and does not import torch: the recording API (``opguard.record``,
``opguard.step``) loads the recorder, and therefore torch, on first use.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and editors see; at run time, loaded on first use
    from .recorder import record, step

__version__ = "0.1.0"
__all__ = ["__version__", "record", "step"]


def __getattr__(name: str) -> Any:
    if name in ("record", "step"):
        from . import recorder

        return getattr(recorder, name)
    raise AttributeError(f"module 'opguard' has no attribute {name!r}")


def _become_the_installed_package() -> None:
    """From a source checkout whose extension was never built, imports the installed package
    in this one's place.

    ``pip install .`` builds ``opguard._C`` into site-packages, and leaves the person at the
    repository root, where ``python -m opguard …`` and ``python -c "import opguard._C"`` find
    this source tree first (both put the working directory ahead of site-packages) and would
    fail on the missing extension. The installed package is what the ``opguard`` command runs,
    so it is what these get too. An editable install, whose extension this tree's imports do
    find, is left as it is."""
    import importlib.util
    import os

    if importlib.util.find_spec(f"{__name__}._C") is not None:
        return
    here = os.path.realpath(os.path.dirname(__file__))
    for entry in sys.path:
        package = os.path.join(os.path.abspath(entry or os.curdir), __name__)
        init = os.path.join(package, "__init__.py")
        if os.path.realpath(package) == here or not os.path.isfile(init):
            continue
        if not any(n.startswith("_C.") and not n.endswith(".pyi") for n in os.listdir(package)):
            continue
        spec = importlib.util.spec_from_file_location(
            __name__, init, submodule_search_locations=[package]
        )
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[__name__] = module  # what `import opguard` returns once this file ends
        spec.loader.exec_module(module)
        return


_become_the_installed_package()
