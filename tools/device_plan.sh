# The measurements still owed (see BENCHMARKS.md's last section), in order of need, for
# tools/device_steps.sh: `bash tools/device_steps.sh start tools/device_plan.sh`.
M=/tmp/vtllm-bench-gpu/qwen3-0.6b
[ -d $M ] || python3 -m vtllm synth --shape qwen3-0.6b --out $M > /tmp/res/synth.txt 2>&1
# The staged host copies (executor/staging.py): the GPU gates (the last lease ran out before
# the last test), then what they give serving: HTTP c64 beside HF, then alone twice for the
# spread (the loop's wait a step against the ~5.2 ms GPU step is the figure to watch)
T=600 step gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu
T=900 step http_hf env PY=python3 MODEL=$M VT_ARGS="--device cuda" HF_MODEL=$M \
  HF_ARGS="--device cuda --dtype bfloat16" SKIP_PEER=1 THREADS=16 CONCURRENCY=64 \
  OUT=/tmp/res/http bash loadtest/peers/compare_servers.sh
step http_table python3 loadtest/peers/compare_table.py /tmp/res/http --runs vtllm hf
H="env PY=python3 MODEL=$M SKIP_PEER=1 THREADS=16 CONCURRENCY=64"
for r in a b; do
  T=600 step http_$r $H VT_ARGS="--device cuda" OUT=/tmp/res/http_$r \
    bash loadtest/peers/compare_servers.sh
  step http_${r}_table python3 loadtest/peers/compare_table.py /tmp/res/http_$r --runs vtllm
done
# where a serving step's launch still spends its host time
step mixed python3 tools/device_profile_decode.py $M --batch 56 --context 256 --mixed 128 \
  --host-profile 20
# Decode attention at serving's shape: Nsight of the ring kernel alone (its mangled name; the
# combine launches are attention_split's kernel whichever module runs first)
T=300 step ncu_ring ncu --kernel-name-base mangled --kernel-name regex:attention_ring \
  --launch-count 2 --section SpeedOfLight --section LaunchStats --section Occupancy \
  --section WarpStateStats --section MemoryWorkloadAnalysis python3 tools/device_bench_attention.py \
  --variant vtllm/kernels/cuda/attention_ring.py --cases 0.6B:64:256 --kv bfloat16
