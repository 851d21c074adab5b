#!/usr/bin/env bash
# End-to-end checks of the dsv4 command: published counts, make-model + inspect, and
# clear errors (non-zero exit, no crash) on bad input.
#   cli_test.sh DSV4_BINARY SOURCE_DIR SCRATCH_DIR
set -uo pipefail
dsv4=$1 src=$2 tmp=$3
rm -rf "$tmp" && mkdir -p "$tmp"
failures=0 passed=0

# expect CODE PATTERN -- command...: exit status CODE and output matching the ERE PATTERN.
expect() {
  local code=$1 pattern=$2; shift 2
  local out status
  out=$("$@" 2>&1); status=$?
  if [ "$status" -ne "$code" ] || ! grep -Eq -- "$pattern" <<<"$out"; then
    echo "FAIL: $* -> exit $status (want $code), output:"; echo "$out" | head -20
    echo "      expected /$pattern/"; failures=$((failures + 1))
  else
    passed=$((passed + 1))
  fi
}

flash=$src/tests/fixtures/v4-flash/config.json
pro=$src/tests/fixtures/v4-pro/config.json
expect 0 '284\.3B total, 13\.3B activated' "$dsv4" inspect --config "$flash"
expect 0 '2 window-only, 21 CSA \(ratio 4\), 20 HCA' "$dsv4" inspect --config "$flash"
expect 0 '1573\.0B total, 48\.9B activated' "$dsv4" inspect --config "$pro"
expect 0 '0 window-only, 30 CSA \(ratio 4\), 31 HCA' "$dsv4" inspect --config "$pro"
expect 0 '"total": 284332240471' "$dsv4" inspect --config "$flash" --json

expect 0 'wrote .*tiny' "$dsv4" make-model --preset tiny --out "$tmp/tiny" --seed 1
expect 0 'consistent: yes' "$dsv4" inspect --model "$tmp/tiny"
expect 0 'mtp4:window' "$dsv4" inspect --model "$tmp/tiny"
expect 0 'wrote' "$dsv4" make-model --config "$tmp/tiny/config.json" --out "$tmp/sharded" --max-shard-mb 1
expect 0 'consistent: yes' "$dsv4" inspect --model "$tmp/sharded"
cmp -s <("$dsv4" inspect --model "$tmp/tiny" --json | grep -vE "directory|safetensors|config.json") \
       <("$dsv4" inspect --model "$tmp/sharded" --json | grep -vE "directory|safetensors|config.json") ||
  { echo "FAIL: sharded and single-file tiny models inspect differently"; failures=$((failures + 1)); }

# A checkpoint that does not match its config: every problem listed, exit 1.
cp -r "$tmp/tiny" "$tmp/mismatch"
sed -i 's/"n_routed_experts": 8/"n_routed_experts": 6/' "$tmp/mismatch/config.json"
expect 1 'unexpected tensors: .*experts\.6' "$dsv4" inspect --model "$tmp/mismatch"

# Bad input: clear errors, non-zero exit, never a crash (exit 1 = our error, 105-109 = CLI11 usage).
echo '{"hidden_size": 4096' > "$tmp/truncated.json"
expect 1 'invalid JSON' "$dsv4" inspect --config "$tmp/truncated.json"
python3 -c "print('['*100000 + ']'*100000)" > "$tmp/bomb.json"
expect 1 'nested deeper' "$dsv4" inspect --config "$tmp/bomb.json"
sed 's/"q_lora_rank": 1024,//' "$flash" > "$tmp/missing.json"
expect 1 "missing field 'q_lora_rank'" "$dsv4" inspect --config "$tmp/missing.json"
expect 1 "unknown preset 'huge'" "$dsv4" make-model --preset huge --out "$tmp/x"
expect 1 'over the limit' "$dsv4" make-model --config "$flash" --out "$tmp/flash"
mkdir -p "$tmp/empty" && cp "$tmp/tiny/config.json" "$tmp/empty/"
expect 1 'safetensors' "$dsv4" inspect --model "$tmp/empty"
head -c 100000 "$tmp/tiny/model.safetensors" > "$tmp/cut.safetensors"
mkdir -p "$tmp/cut" && cp "$tmp/tiny/config.json" "$tmp/cut/" && mv "$tmp/cut.safetensors" "$tmp/cut/model.safetensors"
expect 1 'model.safetensors' "$dsv4" inspect --model "$tmp/cut"
expect 105 'does not exist|not exist' "$dsv4" inspect --config "$tmp/nope.json"
expect 108 'Excludes|excludes' "$dsv4" inspect --config "$flash" --model "$tmp/tiny"
expect 0 'make-model' "$dsv4" --help
expect 0 '--seed' "$dsv4" make-model --help

rm -rf "$tmp"
echo "cli: $passed passed, $failures failed"
[ "$failures" -eq 0 ]
