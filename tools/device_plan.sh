# The measurements still owed (see BENCHMARKS.md's last section), in order of need, for
# tools/device_steps.sh: `bash tools/device_steps.sh start tools/device_plan.sh`.
M=/tmp/vtllm-bench-gpu/qwen3-0.6b
[ -d $M ] || python3 -m vtllm synth --shape qwen3-0.6b --out $M > /tmp/res/synth.txt 2>&1
# A mixed c64 step (56 decodes + a 128-token prompt: 184 rows) runs its linears in linear_rows,
# 3-4x torch's time there (0.6B gate_up 30.9 us against 7.7 on the H100): each block holds
# ROWS = 2 row tiles of W and reads all of x for them. More row tiles a block, fewer reads of x
# (same bits: the order of the sums does not depend on ROWS), against ROWS 2 at the same rows
for v in "4 2" "4 3" "4 4"; do
  set -- $v
  sed -e "s/^ROWS = 2 /ROWS = $1 /" -e "s/^STAGES = 4 /STAGES = $2 /" \
    vtllm/kernels/cuda/linear_rows.py > /tmp/rows_r$1s$2.py
done
V=/tmp/rows_r4s2.py,/tmp/rows_r4s3.py,/tmp/rows_r4s4.py
step rows_06 python3 tools/device_bench_linear.py --x-bf16 --rows --rows-variant $V \
  --shapes "0.6B qkv,0.6B o,0.6B gate_up,0.6B down" --ms 64,128,184,256 --prefill ""
step rows_8b python3 tools/device_bench_linear.py --x-bf16 --rows --rows-variant $V \
  --shapes "8B qkv,8B gate_up,8B down" --ms 16,32,64 --prefill ""
# HTTP c64, vtllm alone, the decode kernels' rows at max-num-seqs (64) and at the new default
# (256 as the scratch cap allows), alternated twice for the run-to-run spread
H="env PY=python3 MODEL=$M SKIP_PEER=1 THREADS=16 CONCURRENCY=64"
for r in a b; do
  T=600 step http_64_$r $H VT_ARGS="--device cuda --cuda-split-attention-rows 64" \
    OUT=/tmp/res/http_64_$r bash loadtest/peers/compare_servers.sh
  T=600 step http_auto_$r $H VT_ARGS="--device cuda" OUT=/tmp/res/http_auto_$r \
    bash loadtest/peers/compare_servers.sh
done
for d in http_64_a http_auto_a http_64_b http_auto_b; do
  step ${d}_table python3 loadtest/peers/compare_table.py /tmp/res/$d --runs vtllm
done
# the GPU gates with the new default
T=600 step gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu
