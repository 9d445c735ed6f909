#!/usr/bin/env bash
# Installs OpGuard into the environment of `python3` (an active venv's, say), with the extras
# named (`bash tools/install.sh test`, `bash tools/install.sh mcp,record`):
# from this Python's wheel in dist/ when there is one (tools/build_wheel.sh builds it; no
# compiler needed), else from source, which builds the extension (`pip install .`).
#
# By path, never by name: another project's package is called opguard on PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

extras=${1:+[$1]}
tag=$(python3 -c 'import sys; print("cp{}{}".format(*sys.version_info[:2]))')
shopt -s nullglob
wheels=(dist/opguard-*-"$tag"-"$tag"-*.whl)
case ${#wheels[@]} in
  0)
    echo "install: no $tag wheel in dist/, building from source: a C++17 compiler and CMake," \
      "and nvcc for the GPU kernels (OPGUARD_CUDA=OFF|AUTO|ON; tools/build_wheel.sh makes a wheel)" >&2
    python3 -m pip install ".$extras"
    ;;
  1)
    # Replaces an installed OpGuard of the same version (pip would keep it), as `pip install .`
    # does: a rebuilt wheel is installed, then what it needs.
    python3 -m pip install --force-reinstall --no-deps "${wheels[0]}"
    python3 -m pip install "${wheels[0]}$extras"
    ;;
  *)
    echo "install: several $tag wheels in dist/ (${wheels[*]}): keep the one to install" >&2
    exit 2
    ;;
esac
