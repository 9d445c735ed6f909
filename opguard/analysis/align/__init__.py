"""Aligning two runs: each op's keys (:mod:`.keys`), Myers' diff (:mod:`.myers`) in passes of
looser keys (:mod:`.passes`), ties settled by data flow (:mod:`.ties`), the steps a trace holds
(:mod:`.steps`) and the pairs of the compared steps by op index (:mod:`.step_pairs`); across
parallel layouts, which ranks and ops pair (:mod:`.layouts`).
"""

from .passes import align_keys, align_step, columns_of, merge, pairs_of, records_of

__all__ = ["align_keys", "align_step", "columns_of", "merge", "pairs_of", "records_of"]
