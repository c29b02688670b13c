#!/usr/bin/env bash
# Builds the Python module `import kvlab` from this checkout and installs it into kvlab's venv
# (${KVLAB_CACHE:-~/.cache/kvlab}/venv, made from Debian's python3 with its site packages, so that
# Debian's numpy and pytest are there); prints the venv's python on stdout. Idempotent: the
# CMake build in build-python/ is incremental (ccache when present). Run by scripts/setup.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
SKBUILD_VERSION=0.11.6
venv="${KVLAB_CACHE:-$HOME/.cache/kvlab}/venv"
py=/usr/bin/python3
# Debian's python3-venv, -dev, numpy and pybind11 (and the pinned llama.cpp build) first
prefix=$(bash "$root/scripts/deps.sh" | tail -n 1)
if [ ! -x "$venv/bin/python" ]; then
  echo "[python] creating $venv" >&2
  "$py" -m venv --system-site-packages "$venv" >&2
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
export PIP_ROOT_USER_ACTION=ignore
if ! "$venv/bin/python" -c "import scikit_build_core, sys; sys.exit(scikit_build_core.__version__ != '$SKBUILD_VERSION')" 2>/dev/null; then
  echo "[python] pip install scikit-build-core==$SKBUILD_VERSION" >&2
  "${pip[@]}" install --quiet "scikit-build-core==$SKBUILD_VERSION" >&2
fi
if command -v ccache >/dev/null; then export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache; fi
echo "[python] building and installing the kvlab module (build-python/)" >&2
KVLAB_DEPS_PREFIX="$prefix" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  "${pip[@]}" install --quiet --no-build-isolation --no-deps "$root" >&2
"$venv/bin/python" -c "import kvlab" >&2
echo "$venv/bin/python"
