"""``opguard tui``: the terminal debugger over two recorded runs (Textual).

Only the ``tui`` command imports this package: recording and reading traces never load Textual.
"""
