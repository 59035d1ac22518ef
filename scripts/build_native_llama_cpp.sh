#!/usr/bin/env bash
# Builds the llama.cpp library that the llama.cpp engine runs, for this machine's CPU (GGML_NATIVE), from the
# sources of the pinned `xllamacpp` version on PyPI (the same llama.cpp commit as the wheel, whose struct
# layouts the engine declares), into SPECSERVE_HOME/llama.cpp-native/VERSION/ with the CPU's flags. Workers
# then use it (ModelConfig.llama_cpp_build `auto`) instead of the wheel's portable build. 2-5 minutes on
# two cores. Usage: scripts/build_native_llama_cpp.sh [PYTHON]   (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
read -r VERSION DEST < <("$PY" -c '
from specserve.models.config import default_home
from specserve.models.llama_cpp import BINDING_VERSION, NATIVE_DIR
print(BINDING_VERSION, default_home() / NATIVE_DIR / BINDING_VERSION)')
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "fetching xllamacpp $VERSION's sources" >&2
"$PY" -m pip download --quiet --no-deps --no-binary :all: "xllamacpp==$VERSION" -d "$WORK"
tar xzf "$WORK/xllamacpp-$VERSION.tar.gz" -C "$WORK"
SRC="$WORK/xllamacpp-$VERSION/thirdparty/llama.cpp"
mkdir -p "$DEST"
LOG="$DEST/build.log"
echo "building libllama for this CPU (2-5 minutes on two cores; log: $LOG)" >&2
if ! { cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON \
    -DGGML_OPENMP=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
    -DCMAKE_INSTALL_RPATH='$ORIGIN' && cmake --build "$WORK/build" --target llama -j"$(nproc)"; } >"$LOG" 2>&1; then
  tail -20 "$LOG" >&2
  exit 1
fi
cp -P "$WORK"/build/bin/lib*.so* "$DEST/"
grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2 > "$DEST/cpu_flags"
echo "$DEST/libllama.so"
