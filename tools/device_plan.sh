# The measurements still owed (see BENCHMARKS.md's last section), in order of need, for
# tools/device_steps.sh: `bash tools/device_steps.sh start tools/device_plan.sh`.
# 1. gemm_wgmma (Hopper's warpgroup mma) with stages overlapped (two A fragment sets, no wait
#    injected by ptxas), not yet run on a card: bits against linear_mma, speed against
#    gemm_mma and torch.
B="python3 tools/device_bench_linear.py --wgmma --gemm-ms 1024,4096 --shapes"
T=600 step wgmma_bench $B "8B qkv,8B o,8B gate_up,8B down,0.6B qkv,0.6B gate_up"
# 2. The model's long steps on it (VT_CUDA_PREFILL_GEMM=wgmma) against the default, same
#    lease: TTFT on both shapes; then the kernel tests (bits against linear_mma, the routing
#    test) and the GPU gates (test_wgmma_gives_the_mma_logits: a 512-token chunk of the 0.6B
#    shape through gemm_wgmma, every logit with gemm_mma's bits).
G="python3 -m vtllm bench gpu --peers none --batches 1 --prompts 1024,4096 --shapes llama3-8b,qwen3-0.6b"
T=900 step ttft_mma $G --prefill-gemm mma
T=900 step ttft_wgmma $G --prefill-gemm wgmma
T=900 step wgmma_tests python3 -m pytest -q -p no:cacheprovider -m cudasim tests/kernels_cuda/test_gemm_wgmma.py
T=900 step gpu_gates python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu
# 3. Tiling variants (sed copies of the module; offline: 2 x 12 166 registers, no stack;
#    3 warpgroups at 168 registers spill 164 bytes; 4 x 6 as committed: 192, no stack).
K=vtllm/kernels/cuda/gemm_wgmma.py
L="WARPGROUPS, TOKENS, STAGE_TILES, STAGES = 2, 128, 4, 6"
sed "s/$L/WARPGROUPS, TOKENS, STAGE_TILES, STAGES = 2, 128, 2, 12/" $K > /tmp/wg_2x12.py
sed -e "s/$L/WARPGROUPS, TOKENS, STAGE_TILES, STAGES = 3, 128, 4, 5/" \
  -e 's/^_REGISTERS = {}/_REGISTERS = {"max_registers": 168}/' $K > /tmp/wg_3wg.py
for v in 2x12 3wg; do T=600 step wgmma_$v $B "8B qkv,8B gate_up" --variant /tmp/wg_$v.py; done
