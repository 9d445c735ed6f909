#!/usr/bin/env bash
# Everything GPU in one device session: build the extension for Hopper, run the cuda tests,
# then the GPU benchmarks, writing each output under $OUT (default ./gpu-out).
#
#   bash bench/gpu_session.sh [tests] [bench] [kernels] [ddp] [compile] [parts] [fixture] [long] [tolerant] [fuzz]
#                                        (default: all but parts, fixture, long, tolerant and fuzz)
#   fixture: records tests/data/cross_version/mlp.py and hf_models.py (an HF Llama and GPT-2)
#            with this machine's torch on its CPU, into $OUT/fixtures.tgz (unpack it into
#            tests/data/cross_version/: the cross-version pairs)
#   long:    issue 28's targets (bench/long_runs.py: --steps-only, --window, step-level trace
#            size, --keep-last 20 over 1,000 GPT-2 steps), then opguard hunt on a 200-step
#            GPT-2 pair whose run B scales step 150's loss (tests/cuda_scenarios/gpt2_long.py)
#   tolerant: issue 38's GPU pairs (bench/tolerant_gpu.py: TF32, bf16 autocast, fused AdamW,
#            attention kernels, index_add_'s atomics, GPT-2 with dropout, a Llama-class model,
#            and real changes behind them), the traces in $OUT/tolerant-traces.tgz
#   fuzz:    the mutation fuzzer's GPU programs (bench/fuzz.py --device cuda, FUZZ_PAIRS pairs,
#            default 500): its table in $OUT/fuzz_gpu.txt goes into docs/COMPARING.md's GPU
#            block, the pairs answered wrongly under $OUT/fuzz-failures
#   bash bench/gpu_session.sh build                                         (only build)
#
# On a machine without lmdb, put its wheel in .whl/ first (see docs/PERFORMANCE.md).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
ROOT=$PWD
parts=${*:-tests bench kernels ddp compile}

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ ! -f /tmp/opguard-built ] || [ -n "$(find csrc opguard -newer /tmp/opguard-built -print -quit)" ]; then
  rm -rf build  # a kept build/ whose files are older than the sources would go stale silently
  python3 -m pip install --no-build-isolation --no-deps -q . \
    -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90 -C cmake.define.OPGUARD_CUDA=ON || exit 1
  touch /tmp/opguard-built
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"

cd /tmp  # never import opguard from the source tree (it has no built extension)
for part in $parts; do
  case $part in
    tests)
      # only the files with GPU tests: the others need the UI and agent dependencies. Each
      # file in a process of its own (no addopts: pytest-xdist's workers), the three at once,
      # which a call's time limit needs; the fuzzer's GPU pairs, a few processes each, on
      # workers of their own where pytest-xdist is installed (its wheels in .whl/ as well)
      xdist=$(python3 -c 'import xdist' 2>/dev/null && echo yes || true)
      for file in test_cuda test_compiled test_fuzz; do
        workers=()
        [ $file = test_fuzz ] && [ -n "$xdist" ] && workers=(-n 6)
        python3 -m pytest -q -p no:cacheprovider -o addopts= -m cuda "${workers[@]}" \
          "$ROOT/tests/$file.py" > "$OUT/tests_$file.txt" 2>&1 &
      done
      wait
      tail -n 25 "$OUT"/tests_*.txt ;;
    bench)
      python3 "$ROOT/bench/fingerprint_gpu.py" --mib 512 2>&1 | tee "$OUT/fingerprint_gpu.txt"
      python3 "$ROOT/bench/overhead.py" --rounds 2 --steps 5 --json "$OUT/overhead.json" 2>&1 \
        | grep -v Warning | tee "$OUT/overhead.txt"
      # what users run: bf16 autocast, eager and compiled (issue 40's targets table)
      python3 "$ROOT/bench/overhead.py" --bf16 --rounds 2 --steps 5 --no-debugmode \
        --json "$OUT/overhead_bf16.json" 2>&1 | grep -v Warning | tee "$OUT/overhead_bf16.txt"
      python3 "$ROOT/bench/overhead.py" --bf16 --compile --rounds 2 --steps 5 --no-debugmode \
        --json "$OUT/overhead_bf16_compile.json" 2>&1 | grep -v Warning \
        | tee "$OUT/overhead_bf16_compile.txt"
      python3 "$ROOT/bench/overhead_profile.py" --steps 3 2>&1 | grep -v Warning | tee "$OUT/profile.txt"
      # where a bf16 step's host time goes: by phase, and the step level's parts
      python3 "$ROOT/bench/overhead_profile.py" --bf16 --phases --steps 3 2>&1 | grep -v Warning \
        | tee "$OUT/profile_bf16_phases.txt"
      python3 "$ROOT/bench/overhead_profile.py" --bf16 --steps-only --steps 5 2>&1 \
        | grep -v Warning | tee "$OUT/profile_bf16_steps.txt" ;;
    kernels)
      python3 "$ROOT/bench/overhead_profile.py" --steps 2 --gpu --top 12 2>&1 | grep -v Warning \
        | tail -14 | tee "$OUT/profile_gpu.txt" ;;
    ddp)
      python3 -m torch.distributed.run --standalone --nproc-per-node 2 "$ROOT/bench/overhead.py" --rounds 2 --steps 5 \
        --no-debugmode --json "$OUT/overhead_ddp.json" > "$OUT/overhead_ddp.txt" 2>&1
      grep -v Warning "$OUT/overhead_ddp.txt" | grep -B2 -A12 "Error\|GPT-2" | head -60 ;;
    parts)  # what each part of the recorder costs per op on this host (host-bound batch)
      python3 "$ROOT/bench/host_parts.py" --rounds 3 --steps 6 2>&1 | grep -v Warning \
        | tee "$OUT/host_parts.txt" ;;
    fixture)
      version=$(python3 -c 'import torch; print(".".join(torch.__version__.split(".")[:2]))')
      mkdir -p /tmp/fixtures
      for script in "mlp.py" "hf_models.py llama" "hf_models.py gpt2"; do
        set -- $script
        name=$([ $# -gt 1 ] && echo "$2-" || true)torch-$version
        CUDA_VISIBLE_DEVICES= python3 -m opguard record -o "/tmp/fixtures/$name" --overwrite -- \
          "$ROOT/tests/data/cross_version/$1" "${@:2}" 2>&1 | tail -3 | tee -a "$OUT/fixture.txt"
      done
      rm -f /tmp/fixtures/*/rank-*/lock.mdb
      tar -C /tmp/fixtures -czf "$OUT/fixtures.tgz" . ;;
    long)
      python3 "$ROOT/bench/overhead.py" --rounds 3 --steps 5 --no-debugmode \
        --json "$OUT/overhead_long.json" 2>&1 | grep -v Warning | tee "$OUT/overhead_long.txt"
      python3 "$ROOT/bench/long_runs.py" --overhead "$OUT/overhead_long.json" \
        --json "$OUT/long_runs.json" 2>&1 | grep -v Warning | tee "$OUT/long_runs.txt"
      scenario="$ROOT/tests/cuda_scenarios/gpt2_long.py"
      start=$(date +%s)
      python3 -m opguard hunt -o "$OUT/hunt" --overwrite --a "$scenario" \
        --b "$scenario --scale-at 150" > "$OUT/hunt.txt" 2>&1
      echo "opguard hunt: exit $? in $(( $(date +%s) - start )) s (200 GPT-2 steps, twice)" \
        | tee -a "$OUT/hunt.txt"
      head -12 "$OUT/hunt.txt"
      rm -rf "$OUT"/hunt/?-steps "$OUT"/hunt/?-window ;;  # ~35 MB of traces; the logs stay
    tolerant)
      # issue 38's GPU pairs (tests/tolerant_runs.py's GPU_PAIRS: the fit half and the held-out
      # half), each compared by opguard diff --tolerant; the traces come back as one archive
      # for bench/tolerant_calibration.py (on any machine: reading them needs no torch)
      python3 "$ROOT/bench/tolerant_gpu.py" --root /tmp/tolerant --json "$OUT/tolerant.json" \
        2>&1 | grep -v Warning | tee "$OUT/tolerant.txt"
      rm -f /tmp/tolerant/*/rank-*/lock.mdb
      tar -C /tmp -czf "$OUT/tolerant-traces.tgz" tolerant
      ls -la "$OUT/tolerant-traces.tgz" ;;
    fuzz)
      python3 "$ROOT/bench/fuzz.py" --device cuda --pairs "${FUZZ_PAIRS:-500}" --workers 12 \
        --save-failures "$OUT/fuzz-failures" 2>&1 | grep -v Warning | tee "$OUT/fuzz_gpu.txt" ;;
    build) ;;  # the build above is all
    compile)
      python3 "$ROOT/bench/overhead.py" --compile --rounds 2 --steps 5 --no-debugmode \
        --json "$OUT/overhead_compile.json" > "$OUT/overhead_compile.txt" 2>&1
      grep -v Warning "$OUT/overhead_compile.txt" | grep -B2 -A12 "Error\|GPT-2" | head -60 ;;
  esac
done
