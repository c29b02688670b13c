# Sourced by setup.sh, test-sanitize.sh and fuzz.sh (with $root set): what every build of kvlab
# starts from. prepare_build [deps.sh options] installs the packages and the pinned llama.cpp
# build (scripts/deps.sh), fetches the default model (and with --tests gemma3-270m, which the
# Gemma 3 tests compare with libllama), and sets $prefix (the llama.cpp install
# prefix) and $launcher (CMake's ccache launcher options, when ccache is there).
prepare_build() {
  prefix=$(bash "$root/scripts/deps.sh" "$@" | tail -n 1)
  bash "$root/scripts/models.sh" smollm2-135m >/dev/null
  if [ "${1:-}" = "--tests" ]; then bash "$root/scripts/models.sh" gemma3-270m >/dev/null; fi
  launcher=()
  if command -v ccache >/dev/null; then  # the sloppiness lets ccache cache files built with a precompiled header
    launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;ccache"
              -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
}
