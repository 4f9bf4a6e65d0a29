"""Rules every CUDA kernel of the project keeps, checked on the source (no GPU needed)."""

import ast
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[1] / "vtllm" / "kernels" / "cuda"


def _is_kernel(fn: ast.FunctionDef) -> bool:
    """Decorated @cuda.jit or @cuda.jit(...) without device=True: launched from the host."""
    for d in fn.decorator_list:
        if ast.unparse(d) == "cuda.jit":
            return True
        if isinstance(d, ast.Call) and ast.unparse(d.func) == "cuda.jit":
            return not any(k.arg == "device" for k in d.keywords)
    return False


def _kernels():
    for path in sorted(KERNELS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and _is_kernel(node):
                yield path.name, node


def _first_statement(fn: ast.FunctionDef) -> ast.stmt:
    body = fn.body
    has_doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    return body[1] if has_doc else body[0]


def test_every_kernel_starts_with_the_grid_dependency_wait():
    """Graphs replay with programmatic edges (executor/cuda_graphs): a kernel may start before
    the one it follows has finished, so before anything else it must wait for it."""
    kernels = list(_kernels())
    assert len(kernels) >= 20, "the walk should find the project's kernels"
    missing = [
        f"{name}: {fn.name}"
        for name, fn in kernels
        if ast.unparse(_first_statement(fn)) != "grid_dependency_sync()"
    ]
    assert not missing, f"kernels not starting with grid_dependency_sync(): {missing}"
