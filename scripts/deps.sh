#!/usr/bin/env bash
# Installs everything kvlab needs on a fresh Debian 12 machine, idempotently:
#   1. Debian packages (compilers, libraries; with --tests the test tools too, with --fuzz clang
#      and its libFuzzer runtime);
#   2. the pinned llama.cpp tree from the llama-cpp-python sdist (sha256-checked),
#      built as static libraries into a cache keyed by version (reused when present); with
#      --bench also llama-bench, the anchor of `kvlab bench` (its `common` library is a third of
#      the build: not on the way to a first run, nor needed by the tests).
# Prints the install prefix of the llama.cpp build on its last line.
set -euo pipefail

LLAMA_CPP_PY_VERSION="0.3.36"
LLAMA_CPP_PY_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
CACHE="${KVLAB_CACHE:-$HOME/.cache/kvlab}"
DEPS="$CACHE/deps/llama-cpp-python-$LLAMA_CPP_PY_VERSION"
# KVLAB_DEPS_MARCH=x86-64-v3: a second build for AVX2 machines instead of this CPU (no AVX-512,
# which valgrind cannot run: scripts/build-callgrind.sh), in its own prefix, without llama-bench.
MARCH="${KVLAB_DEPS_MARCH:-}"
PREFIX="$DEPS/install${MARCH:+-$MARCH}"
BUILD="$DEPS/build${MARCH:+-$MARCH}"

log() { echo "[deps] $*" >&2; }

# What kvlab needs to build and run; with --tests also what its test suite needs.
pkgs=(build-essential cmake ninja-build ccache pkg-config git python3-pip
      nlohmann-json3-dev libcli11-dev libssl-dev libcpp-httplib-dev libeigen3-dev valgrind
      python3-dev python3-venv python3-numpy pybind11-dev libhiredis-dev
      libopenblas0-pthread)  # numpy's BLAS: Debian's default is the reference one (10x slower lstsq)
[ "${1:-}" = "--tests" ] && pkgs+=(libgtest-dev libgmock-dev libtinyxml2-dev chromium chromium-driver python3-selenium python3-pytest parallel redis-server)
[ "${1:-}" = "--fuzz" ] && pkgs+=(clang libclang-rt-dev libomp-dev)  # scripts/fuzz.sh
bench=0
[ "${1:-}" = "--bench" ] && bench=1
need_apt=()
for pkg in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >&2
fi

# The build is tuned to this CPU (GGML_NATIVE): a cached build made on another CPU is redone.
CPU_KEY=$( (grep -m1 '^flags' /proc/cpuinfo; echo no-amx) | sha256sum | cut -c1-16)
[ -n "$MARCH" ] && CPU_KEY="$MARCH"
# llama.cpp's own llama-bench, the anchor of `kvlab bench`: built in the same tree with the
# same flags (the `common` library it needs is built for it alone), copied into $PREFIX/bin.
build_llama_bench() {
  log "building llama-bench (the anchor of kvlab bench)"
  cmake -S "$DEPS/src" -B "$BUILD" -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON >&2
  cmake --build "$BUILD" --target llama-bench -j "$(nproc)" >&2
  install -D -m 755 "$BUILD/bin/llama-bench" "$PREFIX/bin/llama-bench"
}
if [ -f "$PREFIX/.complete" ]; then
  [ -f "$PREFIX/.cpu" ] || echo "$CPU_KEY" > "$PREFIX/.cpu"
  if [ "$(cat "$PREFIX/.cpu")" = "$CPU_KEY" ]; then
    if [ -z "$MARCH" ] && [ $bench = 1 ] && [ ! -x "$PREFIX/bin/llama-bench" ] && [ -f "$BUILD/CMakeCache.txt" ]; then
      build_llama_bench
    fi
    log "llama.cpp $LLAMA_CPP_PY_VERSION already built in $PREFIX"
    echo "$PREFIX"
    exit 0
  fi
  log "cached build was made for another CPU: rebuilding"
  rm -rf "$PREFIX" "$BUILD"
fi

mkdir -p "$DEPS"
SDIST="$DEPS/llama_cpp_python-$LLAMA_CPP_PY_VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  log "downloading llama-cpp-python $LLAMA_CPP_PY_VERSION sdist with pip"
  tmp=$(mktemp -d)
  # the sdist only (its build dependencies as wheels: with --no-binary :all: pip builds each of
  # them from source to read the sdist's metadata, minutes on a machine without pip's cache)
  python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$LLAMA_CPP_PY_VERSION" -d "$tmp" >&2
  mv "$tmp"/llama_cpp_python-*.tar.gz "$SDIST"
  rm -rf "$tmp"
fi
got=$(sha256sum "$SDIST" | cut -d' ' -f1)
if [ "$got" != "$LLAMA_CPP_PY_SHA256" ]; then
  log "sha256 mismatch for $SDIST: expected $LLAMA_CPP_PY_SHA256, got $got"
  rm -f "$SDIST"
  exit 1
fi

SRC="$DEPS/src"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  log "unpacking the vendored llama.cpp tree"
  rm -rf "$SRC" "$DEPS/unpack"
  mkdir -p "$DEPS/unpack"
  tar xzf "$SDIST" -C "$DEPS/unpack" "llama_cpp_python-$LLAMA_CPP_PY_VERSION/vendor/llama.cpp"
  mv "$DEPS/unpack/llama_cpp_python-$LLAMA_CPP_PY_VERSION/vendor/llama.cpp" "$SRC"
  rm -rf "$DEPS/unpack"
fi

log "building ggml + libllama (static, CPU): a few minutes on 2 cores"
# ggml's AMX kernels crash (SIGSEGV in ggml_backend_amx_mul_mat, libllama alone) on the
# Xeons of these machines, so -march=native is told to leave AMX out.
NO_AMX=""
grep -q amx_int8 /proc/cpuinfo && NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
isa=(-DGGML_NATIVE=ON)
if [ -n "$MARCH" ]; then  # x86-64-v3: AVX2, FMA, F16C, BMI2
  NO_AMX=""
  isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
fi
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$PREFIX" -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
  "${isa[@]}" -DGGML_OPENMP=ON "-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX" -DGGML_CCACHE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF "${launcher[@]}" >&2
cmake --build "$BUILD" -j "$(nproc)" >&2
cmake --install "$BUILD" >&2
if [ -z "$MARCH" ] && [ $bench = 1 ]; then build_llama_bench; fi
echo "$CPU_KEY" > "$PREFIX/.cpu"
echo "$LLAMA_CPP_PY_VERSION" > "$PREFIX/.complete"
log "done: $PREFIX"
echo "$PREFIX"
