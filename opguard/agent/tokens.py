"""Tokens of a text, estimated without a tokenizer, for the offline reading.

Counting exactly needs LiteLLM (seconds to import) and a model's tokenizer; the offline reading
only says how large the evidence is, so it estimates. The text is split the way GPT-style BPE
tokenizers split it before merging (a letter run with at most one leading symbol, digits three
at a time, punctuation runs, whitespace runs), and each piece counts one token, a letter run one
per started eight letters (long identifiers and hex digits are several tokens). On the evidence
bundles of the test scenarios this is within a few percent of LiteLLM's count for the default
model (``bench/evidence_tokens.py`` prints both).
"""

from __future__ import annotations

import re

# The pre-tokenizer's pieces, in Python's `re`: [^\W\d_] is a letter, and "_" counts as a symbol.
_PIECE = re.compile(
    r"'(?i:[sdmt]|ll|ve|re)"  # English contractions
    r"|(?:[^\r\n\w]|_)?[^\W\d_]+"  # a letter run, with at most one leading symbol
    r"|\d{1,3}"  # digits, three at most
    r"| ?(?:[^\s\w]|_)+[\r\n]*"  # a run of symbols
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"  # whitespace
)
_LETTER = re.compile(r"[^\W\d_]")
LETTERS_PER_TOKEN = 8  # a letter run's length per token, past which it counts as several


def estimate_tokens(text: str) -> int:
    """About how many tokens ``text`` is (see the module's docstring for how, and how close)."""
    return sum(
        1 + (len(piece) - 1) // LETTERS_PER_TOKEN if _LETTER.search(piece) else 1
        for piece in _PIECE.findall(text)
    )
