"""``python -m opguard`` is the ``opguard`` command."""

from .cli import main

main()
