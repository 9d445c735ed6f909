"""The tolerant diff (``opguard diff --tolerant``): of two runs expected to differ by rounding
(another torch build or GPU, TF32, bf16 autocast, another parallel layout), the first op whose
difference rounding does not explain.

The parts: :mod:`.families` (each op family's bound, and every fact about op names),
:mod:`.rule` (how differences are judged: the rule, its fallback, a fixed bound), :mod:`.noise`
(the measured floor of a control run), :mod:`.judge` (the judge the walk asks), :mod:`.sources`
(where a differing input's values were written), :mod:`.views` (distances through views),
:mod:`.unmeasured` (tensors whose distance is unknown, judged by what they feed),
:mod:`.distance` (two sketches' distance), :mod:`.rounding` (an op's unit roundoffs),
:mod:`.judgement` (what is said of a pair), :mod:`.layout_judge` (runs of other parallel layouts).

The walk is the bitwise diff's (:mod:`opguard.analysis.diff`: the same alignment, ops in execution order); at
each aligned pair whose outputs differ, :class:`Judge` decides from the tensors' relative
distances (:mod:`.distance`) whether rounding explains it:

- a non-tensor argument that differs is rounding when it is a number within a few roundings of
  the op's precision of the other run's (a scalar computed from rounded values), else a real
  change (``argument``); a different RNG state is a real change too;
- an input that no recorded op produced (data, initial parameters) must be within a rounding of
  its dtype in each run (``leaf``); one that ops of one run only wrote within what those ops'
  bounds allow from the aligned tensors they read (``structure``); an input an aligned op wrote
  was judged there, unless that op's output is a view (which judges nothing): views are
  followed back to where their values were written, and the ops that computed them are named;
- each output's distance must be within its op family's bound (:mod:`.families`: the op's
  condition from the recorded norms and stats, times the inputs' largest distance, plus its own
  rounding, :mod:`.rounding`), or, with a control run (``--noise``, :mod:`.noise`), within
  :data:`~.rule.NOISE_SAFETY` times the control's distance from run A at that op; else the op
  made the difference (``origin``, with its amplification ``d_out / d_in``);
- integer and bool outputs have no distance: where everything else is explained they are a
  comparison flipped by rounded values (counted, reported, explained);
- with a fixed bound (``--tolerant=REL``) every distance above is compared with ``REL``.

Unknown is never a verdict: a differing tensor whose distance is unknown (a view in one run,
whose base's sketch does not give it; no finite value; a trace recorded before sketches) is
judged by what it feeds. It is taken at what rounding allows the ops that wrote it, and the op
reading it is judged by its measured outputs; it is listed as not judged, and one nothing
judged leaves the verdict incomplete where nothing diverged. (A view nothing read is bounded
where an op that only moves values, a ``stack``, reads it: by its outputs' distance.)

Cost: records are decoded only where fingerprints differ (as the bitwise walk decodes the first
difference), and each judgement is a few sketch distances; the walk stays linear.
"""

from .judge import Judge
from .judgement import DRIFT_AROUND, Judged, Judgement, RankTolerance, Reason
from .noise import NoiseFloor
from .rule import A_DIVIDING, A_FACTOR, R_FACTOR, Mode, Tolerance, parse_tolerance

__all__ = [
    "A_DIVIDING",
    "A_FACTOR",
    "DRIFT_AROUND",
    "R_FACTOR",
    "Judge",
    "Judged",
    "Judgement",
    "Mode",
    "NoiseFloor",
    "RankTolerance",
    "Reason",
    "Tolerance",
    "parse_tolerance",
]
