#!/usr/bin/env bash
# Runs every CPU test: the unit and CLI tests (ctest), then the parsers' fuzz targets
# briefly under ASan/UBSan in a clang build. Used by CI (.ci/run).
#   DSV4_FUZZ_SECONDS=N   seconds per fuzz target (default 20; 0 skips fuzzing)
#   DSV4_TEST_ARGS=...    extra ctest arguments (default "-LE long|gpu": gpu tests need a GPU)
#   DSV4_WERROR=ON        warnings are errors (CI and developers; off for users)
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
jobs=$(nproc)
fuzz_seconds=${DSV4_FUZZ_SECONDS:-20}

# The same build directory and type as tools/quickstart.sh, so a CI run of both builds once.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV4_WERROR="${DSV4_WERROR:-OFF}"
cmake --build build -j"$jobs"

if [ "$fuzz_seconds" != 0 ]; then
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSV4_CUDA=OFF \
        -DCMAKE_CXX_COMPILER=clang++ -DDSV4_FUZZ=ON -DDSV4_FUZZ_SECONDS="$fuzz_seconds"
  cmake --build build-fuzz -j"$jobs" --target fuzz_config fuzz_safetensors fuzz_tokenizer fuzz_openai_request fuzz_chat_reply
  # Fuzz from scratch copies so the committed seed corpora stay small.
  (cd build-fuzz && ctest -L fuzz --output-on-failure)
fi

ctest --test-dir build --output-on-failure -j"$jobs" ${DSV4_TEST_ARGS:--LE long|gpu}
