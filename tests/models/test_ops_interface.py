"""Both backends implement the op interface the forward is written over (models/ops.Ops),
method for method with the same parameters. The CUDA ops are read from their source: importing
numba.cuda needs a GPU or the simulator."""

import ast
import inspect
from pathlib import Path

from vtllm.executor.cpu_ops import CpuOps
from vtllm.models.ops import Ops

ROOT = Path(__file__).resolve().parents[2]


def _protocol() -> dict[str, list[str]]:
    names = [n for n in vars(Ops) if not n.startswith("_") and callable(getattr(Ops, n))]
    return {n: list(inspect.signature(getattr(Ops, n)).parameters) for n in names}


def test_cpu_ops_implement_the_interface():
    for name, params in _protocol().items():
        assert list(inspect.signature(getattr(CpuOps, name)).parameters) == params, name


def test_cuda_ops_implement_the_interface():
    tree = ast.parse((ROOT / "vtllm/executor/cuda_ops.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CudaOps")
    methods = {
        f.name: [a.arg for a in f.args.args] for f in cls.body if isinstance(f, ast.FunctionDef)
    }
    for name, params in _protocol().items():
        assert methods.get(name) == params, name
