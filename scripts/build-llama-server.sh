#!/usr/bin/env bash
# Build llama.cpp's `llama-server` and `llama-quantize` once into the cache folder: the
# benchmark's side-by-side baseline (`make bench-baseline`), the upstream engine the tests put
# this app in front of (tests/backends/test_upstream_llama.py; scripts/test.sh runs this
# first), and, with the source's `convert_hf_to_gguf.py`, the maker of the tests' GGUF files
# (tests/gguf_files.py). Never needed by `make run`. Later runs only print the cached
# llama-server's path.
#
# The sources come from the llama-cpp-python source distribution on PyPI (it vendors
# llama.cpp). GGML_NATIVE=ON dies with an illegal instruction on some virtual machines (its
# AMX path at warm-up), so the build names its instruction sets itself: AVX2/FMA/F16C
# always, the AVX512 family only where /proc/cpuinfo lists it, AMX off.
# Usage: scripts/build-llama-server.sh          -> builds if needed, prints the binary's path
#        scripts/build-llama-server.sh --path   -> prints where it is (or will be), builds nothing
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${CHATAPP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/chatapp}/llama.cpp-$VERSION"
BIN="$CACHE/build/bin/llama-server"
QUANTIZE="$CACHE/build/bin/llama-quantize"
case "${1:-}" in
  "") ;;
  --path) echo "$BIN"; exit 0 ;;
  *) echo "usage: $0 [--path]" >&2; exit 2 ;;
esac
say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
if [ -x "$BIN" ] && [ -x "$QUANTIZE" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$CACHE"
if [ ! -f "$CACHE/src/CMakeLists.txt" ]; then
  say "downloading llama-cpp-python $VERSION (source distribution)"
  tmp=$(mktemp -d)
  .venv/bin/pip download --quiet --no-deps --no-binary llama-cpp-python -d "$tmp" "llama-cpp-python==$VERSION"
  tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
  rm -rf "$CACHE/src"
  mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$CACHE/src"
  rm -rf "$tmp"
fi
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
say "building llama-server and llama-quantize (a few minutes on 2 cores)"
cmake -S "$CACHE/src" -B "$CACHE/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_VBMI="$(has avx512vbmi)" \
  -DGGML_AVX512_VNNI="$(has avx512_vnni)" -DGGML_AVX512_BF16="$(has avx512_bf16)" \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON >&2
cmake --build "$CACHE/build" --target llama-server llama-quantize -j "$(nproc)" >&2
echo "$BIN"
