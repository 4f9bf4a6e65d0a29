# The measurements still owed (see BENCHMARKS.md's last section), in order of need, for
# tools/device_steps.sh: `bash tools/device_steps.sh start tools/device_plan.sh`.
M=/tmp/vtllm-bench-gpu/qwen3-0.6b
[ -d $M ] || python3 -m vtllm synth --shape qwen3-0.6b --out $M > /tmp/res/synth.txt 2>&1
# the GPU gates, with the new one on VT_CUDA_SPLIT_ATTENTION_ROWS (same tokens either way)
T=600 step gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu
# A mixed step's prompt rows through the decode kernels (256 split rows) rather than the prefill
# kernel, whose 128-token prompt is 32 blocks walking 1-4 splits each (~50 us a layer on the
# H200, after the ~50 us of the 56 decode rows); and whether a long prefill's leading 256 rows
# cost more that way. Then HTTP c64 both ways.
step mixed_0 python3 tools/device_profile_decode.py $M --batch 56 --context 256 --mixed 128
step mixed_256 python3 tools/device_profile_decode.py $M --batch 56 --context 256 --mixed 128 --split-rows 256
step prof_2048_0 python3 tools/device_profile_decode.py $M --prefill 2048 --seqs 1
step prof_2048_256 python3 tools/device_profile_decode.py $M --prefill 2048 --seqs 1 --split-rows 256
H="env PY=python3 MODEL=$M SKIP_PEER=1 THREADS=16 CONCURRENCY=64"  # vtllm alone
T=600 step http_0 $H VT_ARGS="--device cuda" OUT=/tmp/res/http_0 bash loadtest/peers/compare_servers.sh
T=600 step http_256 $H VT_ARGS="--device cuda --cuda-split-attention-rows 256" \
  OUT=/tmp/res/http_256 bash loadtest/peers/compare_servers.sh
step http_0_table python3 loadtest/peers/compare_table.py /tmp/res/http_0 --runs vtllm
step http_256_table python3 loadtest/peers/compare_table.py /tmp/res/http_256 --runs vtllm
# HF at c64 beside the faster of the two (its rate moved 477 -> 625 -> 1,247 tok/s run to run)
T=900 step http_hf env PY=python3 MODEL=$M VT_ARGS="--device cuda" HF_MODEL=$M \
  HF_ARGS="--device cuda --dtype bfloat16" SKIP_PEER=1 THREADS=16 CONCURRENCY=64 \
  OUT=/tmp/res/http bash loadtest/peers/compare_servers.sh
step http_table python3 loadtest/peers/compare_table.py /tmp/res/http --runs vtllm hf
# Where the prefill kernel's warps stall, by SASS instruction (Nsight's source page; the SMs
# were busy 54% of its time, issuing every 1.7 cycles then); the report stays out of res.tgz
T=300 step ncu_prefill_full ncu --kernel-name regex:_prefill_kernel --launch-count 1 --set full \
  -o /tmp/ncu_prefill_1024 python3 tools/device_bench_attention.py --prefill 1024 --shapes 0.6B \
  --kv bfloat16
T=120 step ncu_prefill_source ncu -i /tmp/ncu_prefill_1024.ncu-rep --page source --csv \
  --print-source sass
# Decode attention at serving's shape (0.6B, 64 rows of 256 keys): 55.7 us a layer, 46% of the
# b64 step, for 33.5 MB of KV (0.6 TB/s). The split and ring kernels timed, then Nsight's
# durations of the ring kernel and its combine, to see which half is slow
step attn_b64 python3 tools/device_bench_attention.py --variant vtllm/kernels/cuda/attention_ring.py \
  --cases 0.6B:64:256,0.6B:64:1024,8B:32:1024 --kv bfloat16
T=300 step ncu_ring ncu --kernel-name-base demangled --kernel-name "regex:attention_ring|_combine" \
  --launch-count 6 --section SpeedOfLight --section LaunchStats --section Occupancy \
  --section WarpStateStats python3 tools/device_bench_attention.py \
  --variant vtllm/kernels/cuda/attention_ring.py --cases 0.6B:64:256 --kv bfloat16
