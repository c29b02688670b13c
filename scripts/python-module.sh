#!/usr/bin/env bash
# kvlab's venv (${KVLAB_CACHE:-~/.cache/kvlab}/venv, made from Debian's python3 with its site
# packages, so that Debian's numpy and pytest are there) and the Python module `import kvlab` in it.
#   python-module.sh            makes the venv; prints its python on stdout
#   python-module.sh BUILD_DIR  also installs the module built in BUILD_DIR (target _kvlab of
#                               kvlab's own CMake build: the objects the CLI links, compiled once)
# Idempotent; run by scripts/setup.sh. `pip install .` (pyproject.toml) builds the same module
# on its own, for a Python environment of the user's choosing.
set -euo pipefail
venv="${KVLAB_CACHE:-$HOME/.cache/kvlab}/venv"
py=/usr/bin/python3
[ -x "$py" ] || { echo "[python] $py is missing: install Debian's python3 (scripts/deps.sh)" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ]; then
  echo "[python] creating $venv" >&2
  "$py" -m venv --system-site-packages "$venv" >&2
fi
if [ $# -ge 1 ]; then
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # a module pip installed there earlier (pyproject.toml) would shadow this one
  "$venv/bin/python" -m pip uninstall --yes --quiet kvlab >/dev/null 2>&1 || true
  cmake --install "$1" --component python --prefix "$site" >/dev/null
  "$venv/bin/python" -c "import kvlab" >&2
fi
echo "$venv/bin/python"
