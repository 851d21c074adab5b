#!/usr/bin/env bash
# Every GPU test and benchmark on a Hopper GPU (H100 / H200), then a short table.
#
#   tools/gpu-check.sh                  build the GPU targets (sm_90a) in build-gpu, then run them
#   tools/gpu-check.sh --bundle DIR     build, then copy the GPU programs and the libraries they need
#                                       that a CUDA machine may lack into DIR (bin/, lib/); no run
#   tools/gpu-check.sh --prebuilt DIR   run the programs of a bundle (a GPU machine without the
#                                       Debian packages: build elsewhere, carry DIR over)
# Options: --quick (small benchmarks), --no-bench, --no-sanitizer, --only NAME,NAME (run just those
# checks, e.g. gpu_ops,bench_gemm: a run under a time limit per command), --logs DIR (default:
# $OUT, else build-gpu/gpu-check). Building needs tools/install-deps.sh's packages and the CUDA toolkit (nvcc).
# Exit status: 0 when every check that ran passed, 1 when one failed or timed out.
set -uo pipefail
cd "$(dirname "$0")/.."

mode=build
bundle=""
quick=0
bench=1
sanitizer=1
only=""
logs="${OUT:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) mode=bundle; bundle="$2"; shift ;;
    --prebuilt) mode=prebuilt; bundle="$2"; shift ;;
    --quick) quick=1 ;;
    --no-bench) bench=0 ;;
    --no-sanitizer) sanitizer=0 ;;
    --only) only=",$2,"; shift ;;
    --logs) logs="$2"; shift ;;
    *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

programs=(test_device_language test_gpu_ops test_gpu_model bench_gpu_model bench_gpu_gemm bench_gpu_moe bench_gpu_attention bench_gpu_hyper dsv4)

if [ "$mode" != prebuilt ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV4_CUDA=ON -DDSV4_WERROR="${DSV4_WERROR:-OFF}" >/dev/null || exit 1
  cmake --build build-gpu -j"$(nproc)" --target "${programs[@]}" || exit 1
  bin=build-gpu
  find_program() { find build-gpu -type f -name "$1" -perm -u+x | head -n 1; }
  if [ "$mode" = bundle ]; then
    rm -rf "$bundle" && mkdir -p "$bundle/bin" "$bundle/lib"
    for p in "${programs[@]}"; do
      f=$(find_program "$p")
      [ -n "$f" ] || { echo "gpu-check: $p was not built" >&2; exit 1; }
      cp "$f" "$bundle/bin/" && strip --strip-debug "$bundle/bin/$p"
      # Libraries outside the C/C++ runtime, the CUDA driver and the CUDA toolkit's cuBLAS (a CUDA
      # machine has those; libcublasLt alone is half a gigabyte).
      ldd "$f" | awk '/=> \//{print $3}' | grep -vE '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux|libcuda|libcublas|libcublasLt)\.' |
        while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
    done
    du -sh "$bundle"
    exit 0
  fi
else
  # the bundle's libraries, then the toolkit's (cuBLASLt)
  cuda_lib=$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")/../lib64
  export LD_LIBRARY_PATH="$bundle/lib:$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  find_program() { echo "$bundle/bin/$1"; }
fi

logs="${logs:-build-gpu/gpu-check}"
mkdir -p "$logs"
results=()
failures=0
# check NAME TIMEOUT COMMAND...: runs it, keeps its output in $logs/NAME.log, records the outcome.
check() {
  local name="$1" limit="$2"
  shift 2
  if [ -n "$only" ] && [[ "$only" != *",$name,"* ]]; then return 0; fi
  local start=$SECONDS status
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  status=$?
  local verdict=PASS
  [ $status -eq 0 ] || { verdict="FAIL($status)"; failures=$((failures + 1)); }
  [ $status -eq 124 ] && verdict="TIMEOUT"
  results+=("$(printf '| %-34s | %-9s | %5ss |' "$name" "$verdict" "$((SECONDS - start))")")
  echo "== $name: $verdict ($((SECONDS - start)) s)"
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$logs/gpu.txt"
# Time limits: about 5x what each check took on the H200 (device_language 1 s, gpu_ops 34 s,
# gpu_model 27 s, memcheck_ops 15 s, quick bench_attention 4 s; December 2026), so a hung kernel
# (a spinning mbarrier wait, a setmaxnreg that never gets its registers) fails its check instead
# of using up the whole device call.

check device_language 60 "$(find_program test_device_language)"
check gpu_ops 180 "$(find_program test_gpu_ops)"
check gpu_model 180 "$(find_program test_gpu_model)"
# The whole model with the opt-in FP8 products: the routed experts (gemm_experts_fp8.h) and the
# weight-streaming kernel's (gemm_stream.h StreamProducts).
check gpu_model_fp8 180 env DSV4_EXPERTS_FP8=1 DSV4_GEMM_STREAM_FP8=1 "$(find_program test_gpu_model)"

if [ $sanitizer = 1 ] && command -v compute-sanitizer >/dev/null; then
  # memcheck and racecheck on the op tests (the simulator's smaller sizes) and on the tiny model's
  # forward.
  check memcheck_ops 240 env DSV4_GPU_TEST_SMALL=1 compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$(find_program test_gpu_ops)" --gtest_brief=1
  check racecheck_ops 600 env DSV4_GPU_TEST_SMALL=1 compute-sanitizer --tool racecheck --error-exitcode 1 \
    "$(find_program test_gpu_ops)" --gtest_brief=1
  check memcheck_model 600 compute-sanitizer --tool memcheck --error-exitcode 1 "$(find_program test_gpu_model)" \
    --gtest_filter='*CacheBytes*' --gtest_brief=1
fi

if [ $bench = 1 ]; then
  if [ $quick = 1 ]; then
    check bench_gemm 300 "$(find_program bench_gpu_gemm)" --rows 1,8,64,4096 --reps 5 --runs 50
    check bench_gemm_stream_fp8 300 env DSV4_GEMM_STREAM_FP8=1 "$(find_program bench_gpu_gemm)" --rows 1,16,32,64 --reps 5 --runs 50
  else
    check bench_gemm 600 "$(find_program bench_gpu_gemm)"
    check bench_gemm_stream_fp8 600 env DSV4_GEMM_STREAM_FP8=1 "$(find_program bench_gpu_gemm)" --rows 1,16,32,64
  fi
  if [ $quick = 1 ]; then
    check bench_moe 300 "$(find_program bench_gpu_moe)" --reps 10
    check bench_moe_fp8 300 env DSV4_EXPERTS_FP8=1 "$(find_program bench_gpu_moe)" --reps 10
  else
    check bench_moe 600 "$(find_program bench_gpu_moe)"
    check bench_moe_fp8 600 env DSV4_EXPERTS_FP8=1 "$(find_program bench_gpu_moe)"
  fi
  check bench_hyper 120 "$(find_program bench_gpu_hyper)" $([ $quick = 1 ] && echo --reps 20)
  if [ $quick = 1 ]; then
    check bench_attention 120 "$(find_program bench_gpu_attention)" --reps 20
  else
    check bench_attention 600 "$(find_program bench_gpu_attention)"
  fi
  if [ $quick = 1 ]; then
    check bench_model 600 "$(find_program bench_gpu_model)" --layers 4 --batches 1,32 --contexts 4096 --steps 10 --prefill 8192
  else
    check bench_model 900 "$(find_program bench_gpu_model)" --layers 8 --batches 1,32,128 --contexts 4096,131072 --steps 20 \
      --prefill 32768
  fi
  python3 -c 'import torch' >/dev/null 2>&1 && check torch_floor 600 python3 bench/torch_floor.py $([ $quick = 1 ] && echo --quick)
fi

# Serving on the GPU: a Flash-shaped model (4 layers, dummy weights) answers a streaming chat request.
serve_dir=$(mktemp -d)
python3 - tests/fixtures/v4-flash/config.json "$serve_dir/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["num_hidden_layers"] = 4
c["compress_ratios"] = c["compress_ratios"][:4] + c["compress_ratios"][-1:]
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
# (run by `timeout` through bash -c, so it takes everything from the environment)
serve_check() {
  local port=18411
  "$serve_dsv4" serve --device cuda --load-format dummy --model "$serve_dir" --served-model-name m --port $port --max-model-len 8192 \
    --max-num-batched-tokens 512 --max-num-seqs 8 >"$logs/serve_server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 1
  done
  curl -sN "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"model": "m", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16, "stream": true}' \
    >"$logs/serve_stream.txt"
  local ok=$?
  kill -TERM $pid 2>/dev/null
  wait $pid 2>/dev/null
  [ $ok -eq 0 ] && grep -q '\[DONE\]' "$logs/serve_stream.txt"
}
serve_dsv4=$(find_program dsv4)
export serve_dsv4 serve_dir logs
export -f serve_check
if [ -f "$serve_dir/config.json" ]; then
  check serve_stream 400 bash -c serve_check
fi

echo
echo "| check                              | result    |  time |"
echo "|------------------------------------|-----------|-------|"
printf '%s\n' "${results[@]}"
grep -h '^\[gpu-vs-cpu\]' "$logs/gpu_model.log" 2>/dev/null | head -n 12
grep -h '^| decode\|^prefill' "$logs/bench_model.log" 2>/dev/null
grep -h '^| .* | 1 | \|^| .* | 4096 | \|^HBM\|^mma' "$logs/bench_gemm.log" 2>/dev/null
grep -h -m 1 '^| shape | tokens' "$logs/bench_moe.log" 2>/dev/null
grep -h '^| V4-' "$logs/bench_moe.log" 2>/dev/null
grep -h '^| torch' "$logs/torch_floor.log" 2>/dev/null
grep -h '^| V4-\|^| h[0-9]\|^| FP[48], ' "$logs/bench_attention.log" 2>/dev/null
# The exit status is the checks' (the summary lines above print whatever logs exist).
[ "$failures" -eq 0 ]
