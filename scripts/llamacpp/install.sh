#!/usr/bin/env bash
# `make install-llamacpp`: llama.cpp's llama-server and llama-quantize, built from the llama.cpp tree that
# the llama-cpp-python source distribution carries (vendor/llama.cpp; no prebuilt server is downloaded),
# into $LLAMACPP_DIR (.llamacpp, ignored by git) and linked as $LLAMACPP_DIR/bin/llama-server and
# $LLAMACPP_DIR/bin/llama-quantize, where specbench's engine: llama.cpp finds the server. About 8 minutes
# of CPU on 2 cores. Each failure is one line saying which (no compiler, out of disk, no download).
set -euo pipefail

DIR=${LLAMACPP_DIR:-.llamacpp}
SPEC=${LLAMACPP_SPEC:-llama-cpp-python==0.3.36}
JOBS=${LLAMACPP_JOBS:-2}
PYTHON=${PYTHON:-python3}
NEED_MB=${LLAMACPP_NEED_MB:-3000}  # the unpacked tree and the build, with room to spare
TOOLS=(llama-server llama-quantize)

fail() {
  echo "make install-llamacpp: $*" >&2
  exit 1
}

if [ -x "$DIR/bin/llama-server" ] && [ -x "$DIR/bin/llama-quantize" ] && [ -z "${LLAMACPP_REBUILD:-}" ]; then
  echo "llama.cpp is built: $DIR/bin/llama-server (LLAMACPP_REBUILD=1 builds it again)"
  exit 0
fi
command -v cmake >/dev/null || fail "cmake is not installed (apt-get install cmake, or pip install cmake)"
command -v c++ >/dev/null || command -v g++ >/dev/null || fail "no C++ compiler is installed (apt-get install g++)"
command -v cc >/dev/null || command -v gcc >/dev/null || fail "no C compiler is installed (apt-get install gcc)"
mkdir -p "$DIR/src" "$DIR/bin" || fail "cannot create $DIR"
free_mb=$(df -Pm "$DIR" | awk 'NR == 2 {print $4}')
[ "$free_mb" -ge "$NEED_MB" ] || fail "out of disk: $free_mb MB free in $DIR, the build needs about $NEED_MB MB"

archive=$(find "$DIR/src" -maxdepth 1 -name 'llama[-_]cpp[-_]python-*.tar.gz' | head -n 1)
if [ -z "$archive" ]; then
  echo "downloading the $SPEC source distribution"
  "$PYTHON" -m pip download --no-deps --no-binary :all: --quiet -d "$DIR/src" "$SPEC" >"$DIR/download.log" 2>&1 ||
    fail "could not download the $SPEC source distribution: $(tail -n 1 "$DIR/download.log")"
  archive=$(find "$DIR/src" -maxdepth 1 -name 'llama[-_]cpp[-_]python-*.tar.gz' | head -n 1)
  [ -n "$archive" ] || fail "pip downloaded no $SPEC source distribution (see $DIR/download.log)"
fi
llama=$(find "$DIR/src" -mindepth 3 -maxdepth 3 -type d -path '*/vendor/llama.cpp' | head -n 1)
if [ -z "$llama" ]; then
  tar -xzf "$archive" -C "$DIR/src" 2>"$DIR/unpack.log" ||
    fail "cannot unpack $archive: $(tail -n 1 "$DIR/unpack.log") (out of disk?)"
  llama=$(find "$DIR/src" -mindepth 3 -maxdepth 3 -type d -path '*/vendor/llama.cpp' | head -n 1)
fi
[ -n "$llama" ] && [ -f "$llama/CMakeLists.txt" ] || fail "$archive holds no vendor/llama.cpp tree"

echo "building ${TOOLS[*]} in $llama/build (-j $JOBS; the log is $DIR/build.log)"
cmake -S "$llama" -B "$llama/build" -DLLAMA_CURL=OFF -DGGML_NATIVE=ON >"$DIR/configure.log" 2>&1 ||
  fail "cmake could not configure llama.cpp: $(grep -m 1 -i 'error' "$DIR/configure.log" || tail -n 1 "$DIR/configure.log")"
cmake --build "$llama/build" --target "${TOOLS[@]}" -j "$JOBS" >"$DIR/build.log" 2>&1 ||
  fail "the build failed: $(grep -m 1 -iE 'no space left|error' "$DIR/build.log" || tail -n 1 "$DIR/build.log")"
for tool in "${TOOLS[@]}"; do
  [ -x "$llama/build/bin/$tool" ] || fail "the build made no $llama/build/bin/$tool"
  # a link, not a copy: the binary finds its shared libraries beside itself
  # relative, within $DIR (the binaries find their libraries by the build folder's absolute path, so
  # move the checkout and build again: LLAMACPP_REBUILD=1)
  ln -sf "../${llama#"$DIR"/}/build/bin/$tool" "$DIR/bin/$tool"
done
echo "llama-server: $DIR/bin/llama-server ($("$DIR/bin/llama-server" --version 2>&1 | grep -m 1 '^version' || echo 'version unknown'))"
