"""Comparing two runs on a Ray cluster, each rank on the node whose disk holds its traces
(``opguard diff RUN_A RUN_B --ray [ADDRESS]``), for jobs whose traces no single machine holds.

The parts: :mod:`.holdings` (what one node holds of a run: its ranks' traces and, on one node,
its ``meta.json``), :mod:`.placement` (which node compares which ranks, and which traces it
must fetch from another), :mod:`.tasks` (the work done on a node), :mod:`.driver` (the
comparison as a whole: the nodes asked, the ranks compared in two passes, the answer reduced
to the same :class:`~opguard.analysis.RunDiff` as one machine makes) and :mod:`.fetch` (the
few traces ``explain`` and ``tui`` read, fetched where they are not in reach).

Ray is an optional dependency (``pip install 'opguard[ray]'``): nothing here imports it until
a comparison on a cluster starts, so the package costs nothing to a one-machine install.
"""
