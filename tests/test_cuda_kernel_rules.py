"""Rules every CUDA kernel of the project keeps, checked on the source (no GPU needed)."""

import ast
from pathlib import Path

from tests.test_design_rules import imports, module_of, tree

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


# The package's shape (DESIGN.md, Kernels): one public module per op family, implementation
# modules private (a leading underscore), no import circles, and long files say why.

PACKAGE = "vtllm.kernels.cuda"
LONG_FILE_LINES = 400
LONG_FILE_REASON = "Over 400 lines:"  # at the top: the module docstring says why


def _module_edges(files):
    """{module: {modules of the package it imports}} for (path, source) pairs of the package;
    lazy imports count. `from vtllm.kernels.cuda import x` names module x where there is one,
    else the package itself (its __init__)."""
    modules = {module_of(path) for path, _ in files}
    edges = {}
    for path, source in files:
        found = set()
        for _, name in imports(path, source):
            if not (name == PACKAGE or name.startswith(PACKAGE + ".")):
                continue
            parts = name.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            if parts:
                found.add(".".join(parts))
        edges[module_of(path)] = found - {module_of(path)}
    return edges


def import_cycles(files) -> list[list[str]]:
    """The import circles among the files' modules, each as a path that returns to its start."""
    edges = _module_edges(files)
    cycles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(module, path):
        state[module] = 1
        for nxt in sorted(edges.get(module, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return cycles


def private_kernel_imports(files) -> list[str]:
    """['path:line -> name'] for each import of a private module of the package (a name with
    a leading underscore under vtllm.kernels.cuda) from outside it."""
    bad = []
    for path, source in files:
        importer = module_of(path)
        if importer == PACKAGE or importer.startswith(PACKAGE + "."):
            continue
        for line, name in imports(path, source):
            if not name.startswith(PACKAGE + "."):
                continue
            if any(part.startswith("_") for part in name[len(PACKAGE) + 1 :].split(".")):
                bad.append(f"{path}:{line} -> {name}")
    return bad


def test_kernel_modules_import_no_circle():
    cycles = import_cycles(tree("vtllm/kernels/cuda"))
    assert not cycles, "import circles in kernels/cuda:\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


def test_outside_the_package_only_public_kernel_modules_are_imported():
    """The executor (and anything else of vtllm) goes through the family modules and the
    package's table, never through an implementation module."""
    bad = private_kernel_imports(tree("vtllm"))
    assert not bad, "imports of private kernels/cuda modules:\n" + "\n".join(bad)


def test_long_kernel_files_say_why():
    long = [
        f"{path.name}: {n} lines"
        for path in sorted(KERNELS.glob("*.py"))
        if (n := len(path.read_text().splitlines())) > LONG_FILE_LINES
        and LONG_FILE_REASON not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    ]
    assert not long, f"over {LONG_FILE_LINES} lines without '{LONG_FILE_REASON}' at the top:\n" + (
        "\n".join(long)
    )


# The checkers catch a synthetic break.


def test_a_circle_is_reported_lazy_imports_included():
    files = [
        ("vtllm/kernels/cuda/a.py", "from vtllm.kernels.cuda.b import x\n"),
        ("vtllm/kernels/cuda/b.py", "def f():\n    from vtllm.kernels.cuda import c\n"),
        ("vtllm/kernels/cuda/c.py", "from vtllm.kernels.cuda._d import y\nimport numpy\n"),
        ("vtllm/kernels/cuda/_d.py", "from vtllm.kernels.cuda.a import z\n"),
        ("vtllm/kernels/cuda/e.py", "from vtllm.kernels.cuda._d import y\n"),
    ]
    assert import_cycles(files) == [
        [
            "vtllm.kernels.cuda._d",
            "vtllm.kernels.cuda.a",
            "vtllm.kernels.cuda.b",
            "vtllm.kernels.cuda.c",
            "vtllm.kernels.cuda._d",
        ]
    ]
    assert import_cycles(files[1:]) == []


def test_an_import_of_the_package_table_from_inside_is_a_circle():
    files = [
        ("vtllm/kernels/cuda/__init__.py", "from vtllm.kernels.cuda.norm import rms_norm\n"),
        ("vtllm/kernels/cuda/norm.py", "from vtllm.kernels.cuda import SIMULATOR\n"),
    ]
    assert import_cycles(files) == [
        ["vtllm.kernels.cuda", "vtllm.kernels.cuda.norm", "vtllm.kernels.cuda"]
    ]


def test_private_kernel_imports_are_reported():
    cases = {
        "vtllm/executor/a.py": "from vtllm.kernels.cuda._kv_cache import KV_DTYPES\n",
        "vtllm/executor/b.py": "from vtllm.kernels.cuda import _ptx\n",
        "vtllm/executor/c.py": "def f():\n    import vtllm.kernels.cuda._attention_split\n",
        "vtllm/executor/d.py": "from vtllm.kernels.cuda.attention import qkv_attention\n",
        "vtllm/executor/e.py": "from vtllm.kernels.cuda import KV_DTYPES, attention\n",
        "vtllm/kernels/cuda/f.py": "from vtllm.kernels.cuda._ptx import item_at\n",
    }
    bad = private_kernel_imports(list(cases.items()))
    assert [b.split(":")[0] for b in bad] == [
        "vtllm/executor/a.py",
        "vtllm/executor/b.py",
        "vtllm/executor/c.py",
    ]
