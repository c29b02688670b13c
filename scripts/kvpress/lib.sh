# Shared by scripts/bench-kvpress.sh and scripts/xcheck-kvpress.sh (sourced).

# Prints the python of the kvpress venv ($KVLAB_CACHE/kvpress-venv), creating it first:
# kvpress 0.5.5 with torch, transformers and gguf from pip.
kvpress_python() {
  local venv="${KVLAB_CACHE:-$HOME/.cache/kvlab}/kvpress-venv"
  if ! "$venv/bin/python" -c "import kvpress, gguf" 2>/dev/null; then
    echo "[kvpress] installing kvpress 0.5.5, torch, transformers and gguf into $venv" >&2
    python3 -m venv "$venv"
    PIP_ROOT_USER_ACTION=ignore "$venv/bin/pip" install --quiet --disable-pip-version-check kvpress==0.5.5 gguf >&2
  fi
  echo "$venv/bin/python"
}

# write_random_ids PYTHON GGUF N OUT: N token ids drawn from the GGUF's vocabulary with seed
# 1234 (speed does not depend on the text), as a JSON array: the context both tools read.
write_random_ids() {
  "$1" - "$2" "$3" "$4" <<'PY'
import json, random, sys
import gguf
n_vocab = len(gguf.GGUFReader(sys.argv[1]).fields["tokenizer.ggml.tokens"].data)
rng = random.Random(1234)
json.dump([rng.randrange(n_vocab) for _ in range(int(sys.argv[2]))], open(sys.argv[3], "w"))
PY
}

# prepare_context ROOT MODEL TOKENS WORKDIR: builds kvlab (scripts/setup.sh), sets $python,
# $kvlab and $gguf, and writes WORKDIR/ids.json (write_random_ids): what both scripts start from.
prepare_context() {
  python=$(kvpress_python)
  bash "$1/scripts/setup.sh"
  kvlab="${KVLAB_BUILD_DIR:-$1/build}/kvlab"
  gguf=$(bash "$1/scripts/models.sh" "$2")
  write_random_ids "$python" "$gguf" "$3" "$4/ids.json"
}
