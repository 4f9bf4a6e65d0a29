"""`bench` reports name the machine: CPU model, usable cores, SIMD features."""

from vtllm.cli.bench import machine

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni avx512_bf16 sha_ni
processor\t: 1
model name\t: AMD EPYC 9R14
"""


def test_machine_names_the_model_and_its_simd_features():
    text = machine(CPUINFO)
    assert text.startswith("AMD EPYC 9R14, ")
    assert text.endswith("avx2 fma avx512f avx512_vnni avx512_bf16")
    assert "cores usable" in text


def test_a_cpu_without_avx2_says_so():
    assert machine("model name : Old CPU\nflags : fpu sse2\n").endswith("no AVX2")
