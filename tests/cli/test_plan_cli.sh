#!/usr/bin/env bash
# `dsv4 plan` end to end: the published per-sequence KV cache figures (SPEC.md section 6),
# vLLM's page buckets, --json, --config / --model input and bad-input errors.
# Usage: test_plan_cli.sh PATH/TO/dsv4 SOURCE_DIR
set -euo pipefail
dsv4="$1"
flash="$2/tests/fixtures/v4-flash/config.json"
pro="$2/tests/fixtures/v4-pro/config.json"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect_in OUTPUT_FILE NEEDLE...: every needle must appear verbatim.
expect_in() {
  local file="$1"
  shift
  for needle in "$@"; do
    if ! grep -qF -- "$needle" "$file"; then
      echo "FAIL: '$needle' not in the output of: $(head -1 "$file")"
      failures=$((failures + 1))
    fi
  done
}

M=1048576
"$dsv4" plan --config "$pro" --context $M >"$tmp/pro_bf16"
expect_in "$tmp/pro_bf16" "10,326,376,448 B = 9.617 GiB" "90,060,095,488 B = 83.875 GiB" "8.72x less" \
  "bucket 0: 65,536 B" "bucket 1: 16,384 B" "bucket 2: 2,048 B"

"$dsv4" plan --config "$pro" --context $M --kv-cache-dtype fp8 --indexer-cache-dtype fp4 >"$tmp/pro_fp8"
expect_in "$tmp/pro_fp8" "5,275,844,608 B = 4.914 GiB = 5.276 GB" "50,402,951,168 B" "9.55x less" \
  "bucket 0: 37,440 B" "bucket 1: 4,608 B" "bucket 2: 1,728 B"

"$dsv4" plan --config "$flash" --context $M --kv-cache-dtype fp8 --indexer-cache-dtype fp4 >"$tmp/flash_fp8"
expect_in "$tmp/flash_fp8" "3,684,958,208 B = 3.432 GiB = 3.685 GB" "13.68x less" "(2 window-only, 21 CSA, 20 HCA)"

"$dsv4" plan --config "$flash" --context $M --kv-cache-dtype fp8 --indexer-cache-dtype fp8 >"$tmp/flash_fp8_fp8"
expect_in "$tmp/flash_fp8_fp8" "bucket 0: 37,440 B" "bucket 1: 8,640 B" "bucket 2: 1,728 B"

"$dsv4" plan --preset pro --context $M --json >"$tmp/pro.json"
expect_in "$tmp/pro.json" '"compressed_bytes": 10326376448' '"bytes_per_token_layer": 1408'

"$dsv4" plan --preset flash --context 65536 --kv-cache-dtype fp8 --indexer-cache-dtype fp4 \
  --gpu-memory 141 --weights 100 >"$tmp/capacity"
expect_in "$tmp/capacity" "GPU memory 141.00 GiB - weights 100.00 GiB" "sequences of 65,536 tokens"

# The built-in presets agree with the published config files.
for name in flash pro; do
  config="$flash"
  [ "$name" = pro ] && config="$pro"
  "$dsv4" plan --config "$config" --context $M --json | grep -v '"model"' >"$tmp/$name.config.json"
  "$dsv4" plan --preset "$name" --context $M --json | grep -v '"model"' >"$tmp/$name.preset.json"
  if ! cmp -s "$tmp/$name.config.json" "$tmp/$name.preset.json"; then
    echo "FAIL: --preset $name and $config disagree"
    failures=$((failures + 1))
  fi
done

# A config file and a model directory (a small synthetic checkpoint) give the same plan.
"$dsv4" make-model --preset tiny --out "$tmp/tiny" >/dev/null
"$dsv4" plan --config "$tmp/tiny/config.json" --context 4096 | tail -n +2 >"$tmp/from_config"
"$dsv4" plan --preset tiny --context 4096 | tail -n +2 >"$tmp/from_preset"
if ! cmp -s "$tmp/from_config" "$tmp/from_preset"; then
  echo "FAIL: --config and --preset tiny disagree"
  failures=$((failures + 1))
fi
"$dsv4" plan --model "$tmp/tiny" --context 4096 --gpu-memory 1 >"$tmp/from_model"
expect_in "$tmp/from_model" "GPU memory 1.00 GiB - weights 0.01 GiB" "fits "

# Bad input: a clear error and a non-zero exit.
expect_error() {
  local needle="$1"
  shift
  if "$dsv4" plan "$@" >"$tmp/out" 2>&1; then
    echo "FAIL: dsv4 plan $* succeeded"
    failures=$((failures + 1))
  else
    expect_in "$tmp/out" "$needle"
  fi
}
expect_error "--context must be a positive" --preset pro --context 0
expect_error "expected bf16 or fp8" --preset pro --context 10 --kv-cache-dtype fp4
expect_error "expected bf16, fp8 or fp4" --preset pro --context 10 --indexer-cache-dtype int4
expect_error "give exactly one of" --context 10
expect_error "unknown preset" --preset huge --context 10

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "dsv4 plan: all checks passed"
