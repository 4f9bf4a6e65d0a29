"""DESIGN.md's rules, held by tests: imports point one way, and only vtllm/config.py reads the
environment. Both checkers take (path, source) pairs, so the tests at the bottom show each rule
catching a synthetic break. Every import statement counts, lazy ones inside functions too.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANY = None  # an entry point: may import anything of ours

# What the server may see of the engine and the scheduler: it submits prompts and reads deltas
# through the seam, and never builds a scheduler Request nor touches the step loop's parts.
ENGINE_SEAM = {
    "vtllm.engine.engine",  # Engine (submit, abort, run, stop), Stream, Choice
    "vtllm.engine.watchdog",  # the process's guard against a hung step, started by serve()
}
PUBLIC_SCHEDULER_TYPES = {
    "vtllm.scheduler.sampling_params",  # SamplingParams: what a request asks for
    "vtllm.scheduler.output",  # Delta, the one output type, and its finish reasons
}
LEAVES = {"vtllm.errors"}  # typed user errors, raised wherever input is checked (not in kernels)

# Each group (a package or top-level module of vtllm, or loadtest) -> what it may import besides
# itself. An entry covers that module and what is under it (`from m import x` imports m.x).
MAY_IMPORT = {
    "vtllm.__main__": ANY,  # `python -m vtllm`
    "vtllm.cli": ANY,  # serve / generate / bench / synth / config commands
    "vtllm.llm": {  # the offline LLM API: drives the engine through the server's seam
        *LEAVES,
        *ENGINE_SEAM,
        *PUBLIC_SCHEDULER_TYPES,
        "vtllm.config",
        "vtllm.outputs",
        "vtllm.models.loader",  # LoadedModel: weights already in memory may be handed over
        "vtllm.models.chat_template",
    },
    "vtllm": {"vtllm.scheduler.sampling_params", "vtllm.llm"},  # the root re-exports the API
    "vtllm.outputs": {"vtllm.scheduler.plan"},  # LLM's results, built of plan's TokenLogprobs
    "vtllm.config": {"vtllm.errors"},  # leaves: each other only
    "vtllm.errors": {"vtllm.config"},
    "vtllm.server": {
        *LEAVES,
        *ENGINE_SEAM,
        *PUBLIC_SCHEDULER_TYPES,
        "vtllm.config",
        "vtllm.models.tokenizer",  # of models, the tokenizer and chat templates only
        "vtllm.models.chat_template",
        "vtllm.__version__",  # /v1/models and /openapi.json report it
    },
    # models beyond DESIGN.md's list: build.py loads the checkpoint the executor will run, and
    # text.py detokenizes with the model's tokenizer.
    "vtllm.engine": LEAVES | {"vtllm.config", "vtllm.scheduler", "vtllm.executor", "vtllm.models"},
    "vtllm.executor": LEAVES | {"vtllm.scheduler.plan", "vtllm.models", "vtllm.kernels"},
    "vtllm.models": LEAVES | {"vtllm.kernels"},
    "vtllm.scheduler": LEAVES,
    "vtllm.kernels": set(),
    "loadtest": set(),  # talks HTTP
}
# Inside a group: the two kernel backends never import each other.
NEVER_IMPORTS = {
    "vtllm.kernels.cuda": {"vtllm.kernels.cpu"},
    "vtllm.kernels.cpu": {"vtllm.kernels.cuda"},
}

# Today's violations, listed for their redesign; anything new fails. Each entry must still occur.
KNOWN_VIOLATIONS: set[str] = set()

ENV_NAMES = {"environ", "environb", "getenv", "getenvb"}  # os.<name>, or from os import <name>
ENV_READER = "vtllm/config.py"


def module_of(path: str) -> str:
    parts = list(Path(path).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def group_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "vtllm" else parts[0]


def covers(entry: str, module: str) -> bool:
    return module == entry or module.startswith(entry + ".")


def imports(path: str, source: str):
    """(line, dotted name) of every vtllm import in the file, relative ones resolved."""
    package = module_of(path).split(".")
    if not path.endswith("__init__.py"):
        package = package[:-1]
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . / .. / ...x import y
                base = ".".join(package[: len(package) - node.level + 1] + [base] * bool(base))
            found = [base if a.name == "*" else f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in found:
            if covers("vtllm", name):
                yield node.lineno, name


def forbidden(importer: str, name: str) -> bool:
    group = group_of(importer)
    for sub, never in NEVER_IMPORTS.items():
        if covers(sub, importer) and any(covers(n, name) for n in never):
            return True
    allowed = MAY_IMPORT.get(group, set())  # a group without a row may import nothing
    if allowed is ANY or group_of(name) == group:
        return False
    return not any(covers(entry, name) for entry in allowed)


def import_violations(files, known_violations=KNOWN_VIOLATIONS):
    """(['path:line -> name'] for each forbidden import not in KNOWN_VIOLATIONS, the known
    'importer -> name' pairs seen)."""
    bad, known = [], set()
    for path, source in files:
        importer = module_of(path)
        for line, name in imports(path, source):
            if not forbidden(importer, name):
                continue
            pair = f"{importer} -> {name}"
            if pair in known_violations:
                known.add(pair)
            else:
                bad.append(f"{path}:{line} -> {name}")
    return bad, known


def env_readers(files):
    """['path:line -> name'] for each environment access outside vtllm/config.py."""
    bad = []
    for path, source in files:
        if path == ENV_READER:
            continue
        for node in ast.walk(ast.parse(source, path)):
            if isinstance(node, ast.Attribute) and node.attr in ENV_NAMES:
                bad.append(f"{path}:{node.lineno} -> .{node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.module == "os":
                bad += [
                    f"{path}:{node.lineno} -> os.{a.name}"
                    for a in node.names
                    if a.name in ENV_NAMES
                ]
    return bad


def tree(*tops: str):
    return [
        (p.relative_to(ROOT).as_posix(), p.read_text())
        for top in tops
        for p in sorted((ROOT / top).rglob("*.py"))
    ]


def test_imports_point_one_way():
    bad, known = import_violations(tree("vtllm", "loadtest"))
    assert not bad, "imports DESIGN.md forbids (see MAY_IMPORT):\n" + "\n".join(bad)
    assert known == KNOWN_VIOLATIONS, (
        f"fixed, drop from KNOWN_VIOLATIONS: {KNOWN_VIOLATIONS - known}"
    )


def test_only_config_reads_the_environment():
    bad = env_readers(tree("vtllm"))
    assert not bad, f"only {ENV_READER} reads the environment:\n" + "\n".join(bad)


# Each rule, broken on purpose, is reported.


def test_backends_never_import_each_other():
    cases = {
        "vtllm/kernels/cuda/a.py": ("from vtllm.kernels.cpu import rope", "vtllm.kernels.cpu.rope"),
        "vtllm/kernels/cuda/b.py": ("from vtllm.kernels import cpu", "vtllm.kernels.cpu"),
        "vtllm/kernels/cuda/c.py": ("from ..cpu.rope import x", "vtllm.kernels.cpu.rope.x"),
        "vtllm/kernels/cpu/d.py": ("import vtllm.kernels.cuda.rope", "vtllm.kernels.cuda.rope"),
        "vtllm/kernels/cuda/e.py": ("from vtllm.kernels import QType", None),  # shared: fine
    }
    bad, _ = import_violations([(path, source) for path, (source, _) in cases.items()])
    assert bad == [f"{path}:1 -> {name}" for path, (_, name) in cases.items() if name]


def test_forbidden_directions_are_reported():
    cases = {
        "vtllm/server/x.py": "import vtllm.executor.runner",
        "vtllm/server/y.py": "from vtllm.kernels import cpu",
        "vtllm/server/z.py": "from vtllm.scheduler.block_pool import BlockPool",
        "vtllm/server/w.py": "from vtllm.scheduler.request import Request",  # unless listed
        "vtllm/server/v.py": "from vtllm.engine.loop import StepLoop",  # past the seam
        "vtllm/server/u.py": "from vtllm.scheduler.plan import TokenLogprobs",
        "vtllm/engine/x.py": "from vtllm.server import app",
        "vtllm/executor/x.py": "from vtllm.engine.loop import StepLoop",
        "vtllm/models/x.py": "from vtllm.scheduler.plan import StepPlan",
        "vtllm/scheduler/x.py": "from vtllm.config import EngineConfig",
        "vtllm/kernels/x.py": "from vtllm.errors import InvalidParameter",
        "vtllm/config.py": "from vtllm.llm import LLM",
        "vtllm/new_module.py": "from vtllm.errors import VtllmError",  # no row yet
        "loadtest/x.py": "from vtllm.server.protocol import ChatRequest",
    }
    bad, _ = import_violations(list(cases.items()))
    assert [b.split(":")[0] for b in bad] == list(cases)
    seam = "from vtllm.engine.engine import Engine\nfrom vtllm.scheduler.output import STOP\n"
    assert import_violations([("vtllm/server/s.py", seam), ("vtllm/llm.py", seam)])[0] == []
    listed = {"vtllm.server.w -> vtllm.scheduler.request.Request"}
    bad, seen = import_violations([("vtllm/server/w.py", cases["vtllm/server/w.py"])], listed)
    assert bad == [] and seen == listed


def test_lazy_and_relative_imports_are_imports():
    source = "def f():\n    from ..engine import loop\n    return loop\n"
    assert import_violations([("vtllm/executor/x.py", source)])[0] == [
        "vtllm/executor/x.py:2 -> vtllm.engine.loop"
    ]
    allowed = "def f():\n    from . import runner\n    from ..kernels.cpu import rope\n"
    assert import_violations([("vtllm/executor/x.py", allowed)])[0] == []


def test_environment_readers_are_reported():
    cases = [
        'import os\nX = os.environ["X"]\n',
        'import os\nX = os.environ.get("X")\n',
        'import os\ndef f():\n    return os.getenv("X")\n',
        "from os import environ\n",
        "from os import getenv as g\n",
        "import os as o\nENV = dict(o.environ)\n",
    ]
    for source in cases:
        assert env_readers([("vtllm/server/x.py", source)]), source
    assert env_readers([(ENV_READER, cases[0])]) == []
    assert env_readers([("vtllm/server/x.py", "import os\nos.sched_getaffinity(0)\n")]) == []
