#!/usr/bin/env bash
# The GPT-2 overhead bench (bench/overhead.py, no DebugMode) for two builds of OpGuard on one
# machine, alternating: the host speed of a GPU machine drifts by a quarter over minutes, so
# figures from different calls do not compare.
#
#   git archive OLD_REV -o .scratch/old.tar          # on your machine; carry .scratch/ along
#   bash bench/ab_overhead.sh .scratch/old.tar [rounds] [overhead.py options]
#   bash bench/ab_overhead.sh .scratch/old.tar 2 --bf16 --compile   # what users run (issue 40)
#
# "old" is the archived revision, "new" the working tree; each is built for Hopper. The options
# after the rounds replace --no-debugmode (DebugMode takes a minute a round; leave it out).
set -u
OLD_TAR=$(realpath "$1")
ROUNDS=${2:-2}
OPTIONS=("${@:3}")
[ ${#OPTIONS[@]} -eq 0 ] && OPTIONS=(--no-debugmode)
ROOT=$PWD
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
rm -rf /tmp/opguard-old /tmp/opguard-old-site && mkdir -p /tmp/opguard-old
tar -xf "$OLD_TAR" -C /tmp/opguard-old
# both builds at once (device time is what a session is short of)
(cd /tmp/opguard-old && python3 -m pip install --no-build-isolation --no-deps -q \
  --target /tmp/opguard-old-site . -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90 \
  -C cmake.define.OPGUARD_CUDA=ON) > "$OUT/build_old.txt" 2>&1 &
old_build=$!
OUT=$OUT bash bench/gpu_session.sh build > "$OUT/build_new.txt" 2>&1 || { tail -20 "$OUT/build_new.txt"; exit 1; }
wait $old_build || { tail -20 "$OUT/build_old.txt"; exit 1; }
cd /tmp  # never import opguard from the source tree
for round in $(seq "$ROUNDS"); do
  for build in old new; do
    echo "== round $round: $build"
    site=/tmp/site
    [ "$build" = old ] && site=/tmp/opguard-old-site:/tmp/site
    PYTHONPATH=$site python3 "$ROOT/bench/overhead.py" --rounds 2 --steps 5 "${OPTIONS[@]}" 2>&1 \
      | grep -A9 "^GPT-2"
  done
done
