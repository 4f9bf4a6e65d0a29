"""Benchmarks of vtllm, run from the repository root (`python -m bench.gpu`, ...) and kept out
of its wheel: they drive vtllm through its API (the runner and the kernels where a figure is
about them), with the peers beside it. The GPU ones (gpu*.py, gpu.sh) need an NVIDIA GPU and
the `[cuda]` extra; host_cost_serve and serve_fake_steps run on any machine.
"""
