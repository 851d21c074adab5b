#!/usr/bin/env bash
# The main job on a fresh Debian machine: install dependencies, build, and generate with the
# built-in tiny model (written on first use), then show its layer schedule and counts.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV4_WERROR="${DSV4_WERROR:-OFF}"
cmake --build build -j"$(nproc)"
build/src/cli/dsv4 generate --prompt "The GNU General Public License is" --max-tokens 32
build/src/cli/dsv4 inspect --model "${DSV4_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/dsv4}/tiny"
