#!/usr/bin/env bash
# Builds llama.cpp's CPU server (llama-server) for `specserve bench latency|load --peer-llama-cpp BIN_DIR`, from the
# llama-cpp-python 0.3.36 sdist on PyPI, which vendors llama.cpp commit 0c1e570 (the version the
# performance doc's peer figures used), for this machine's CPU (GGML_NATIVE). About 15-20 minutes on two cores.
# Usage: scripts/build_llama_cpp.sh [DIR]   (default /tmp/llama.cpp); prints the bin folder.
set -euo pipefail
DIR=${1:-/tmp/llama.cpp}
SDIST=llama_cpp_python-0.3.36
mkdir -p "$DIR" && cd "$DIR"
[ -f $SDIST.tar.gz ] || python3 -m pip download --quiet --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d .
[ -d $SDIST ] || tar xzf $SDIST.tar.gz
cd $SDIST/vendor/llama.cpp
cmake -S . -B build -G "$(command -v ninja >/dev/null && echo Ninja || echo 'Unix Makefiles')" -DGGML_NATIVE=ON \
  -DCMAKE_BUILD_TYPE=Release -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON >/dev/null
cmake --build build -j"$(nproc)" --target llama-server llama-bench >/dev/null
echo "$PWD/build/bin"
