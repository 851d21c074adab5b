#!/usr/bin/env bash
# Installs the Debian packages dsv4 builds and tests with. Safe to run repeatedly.
set -euo pipefail
packages=(cmake ninja-build g++ clang libclang-rt-14-dev python3 python3-numpy
          nlohmann-json3-dev libfmt-dev libcli11-dev libxxhash-dev libgtest-dev libgmock-dev
          libboost-dev libpcre2-dev libbenchmark-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
