"""Every knob of vtllm, in one table. The only module that reads os.environ.

Each knob has a CLI flag and a VT_ variable (the CLI wins), a type, a default, a range and
one line of help. `python -m vtllm config` prints them with their values and sources.
Over 400 lines because it is one table: a knob's flag, variable, type, range and help stay in
one place, which the README's generated table and `vtllm config` read.
"""

import argparse
import os
from dataclasses import dataclass

import msgspec

from vtllm.errors import InvalidParameter

_SIZE_SUFFIXES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str) -> int:
    """'512M', '2GiB', '1.5g', '1048576' -> bytes."""
    s = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = s[-1:] if s[-1:] in _SIZE_SUFFIXES else ""
    number = float(s[: len(s) - len(unit)])
    return int(number * _SIZE_SUFFIXES[unit])


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


@dataclass(frozen=True, slots=True)
class Knob:
    name: str  # field name; flag --name-with-dashes; env VT_NAME_UPPER
    type: str  # int | float | str | bool | bytes
    default: object
    help: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple | None = None
    secret: bool = False  # never printed
    many: bool = False  # str: several values, `--flag A B` (as vLLM takes them) or "A,B"

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "VT_" + self.name.upper()


KNOBS = (
    Knob(
        "model", "str", None, "GGUF file or HF safetensors directory (default: SmolLM2-135M Q4_1)"
    ),
    Knob(
        "served_model_name",
        "str",
        None,
        "names clients may use for the model, the first reported (default: the model's name)",
        many=True,
    ),
    Knob(
        "embedding_model",
        "str",
        None,
        "an encoder checkpoint (e.g. all-MiniLM-L6-v2's directory) served at /v1/embeddings "
        "beside the chat model (default: none)",
    ),
    Knob(
        "tool_call_parser",
        "str",
        "auto",
        "how the model writes tool calls: hermes (JSON in tool_call tags: Hermes, Qwen), "
        "llama3_json, mistral; auto: read from the chat template, else hermes",
        choices=("auto", "hermes", "llama3_json", "mistral"),
    ),
    Knob(
        "reasoning_parser",
        "str",
        None,
        "split the model's think block into reasoning_content: qwen3 (where the model opens "
        "it) or deepseek_r1 (the output starts inside it) (default: off)",
        choices=("qwen3", "deepseek_r1"),
    ),
    Knob("max_model_len", "int", 4096, "longest sequence (prompt + output) in tokens", 16, 1 << 20),
    Knob("max_num_seqs", "int", 64, "requests decoded together", 1, 4096),
    Knob("max_num_batched_tokens", "int", 2048, "token budget of one step", 16, 1 << 20),
    Knob(
        "kv_cache_memory", "bytes", 0, "KV cache bytes (0: a fraction of free memory)", 0, 1 << 50
    ),
    Knob(
        "kv_cache_fraction",
        "float",
        0.2,
        "share of free memory for KV when no byte budget",
        0.01,
        0.95,
    ),
    Knob(
        "kv_cache_resident_memory",
        "bytes",
        0,
        "CPU: KV bytes written before cached prefixes are evicted for room (0: what llama.cpp's "
        "server commits for max-model-len tokens, f16)",
        0,
        1 << 50,
    ),
    Knob(
        "kv_cache_dtype",
        "str",
        "auto",
        "KV cache storage: float32, or bfloat16 (cuda only: twice the tokens in the same memory, "
        "values rounded to bf16 as vLLM stores them for bf16 models); auto: bfloat16 on cuda, "
        "float32 on cpu",
        choices=("auto", "float32", "bfloat16"),
    ),
    Knob(
        "matmul_input_dtype",
        "str",
        "auto",
        "activations entering bf16 matmuls on the tensor cores: float32 (split into two bf16), "
        "or bfloat16 (cuda only: rounded to bf16 as torch and llama.cpp feed 16-bit GEMMs; half "
        "the tensor-core work, float32 sums either way); auto: bfloat16 on cuda, float32 on cpu",
        choices=("auto", "float32", "bfloat16"),
    ),
    Knob("block_size", "int", 16, "tokens per KV cache block", 1, 1024),
    Knob("enable_prefix_caching", "bool", True, "reuse KV blocks of shared prompt prefixes"),
    Knob("async_depth", "int", 2, "steps in flight: 1 synchronous, 2 overlapped", 1, 2),
    Knob(
        "shadow_check_rate",
        "float",
        0.0,
        "share of steps replayed synchronously to check the overlapped (depth 2) results",
        0.0,
        1.0,
    ),
    Knob(
        "speculative_config",
        "str",
        None,
        "speculative decoding, as vLLM's JSON: "
        '{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": A, '
        '"prompt_lookup_max": B}, or {"method": "draft_model", "model": PATH, '
        '"num_speculative_tokens": K} (default: off)',
    ),
    Knob(
        "tensor_parallel_size",
        "int",
        1,
        "worker processes the model is split over, one GPU each on cuda (llama family; "
        "docs/tensor_parallel.md)",
        1,
        64,
    ),
    Knob(
        "distributed_executor_backend",
        "str",
        "mp",
        "where the tensor-parallel workers run: mp (processes of this host) or ray (actors of "
        "a Ray cluster: RAY_ADDRESS, else a local one; pip install 'vtllm[ray]')",
        choices=("mp", "ray"),
    ),
    Knob(
        "data_parallel_size",
        "int",
        1,
        "engine replicas behind the one endpoint, each request to the least-loaded "
        "(serve only; docs/tensor_parallel.md)",
        1,
        64,
    ),
    Knob("cpu_threads", "int", 0, "numba threads on the CPU backend (0: all cores)", 0, 1024),
    Knob(
        "cpu_numerics",
        "str",
        "exact",
        "CPU matmuls: exact (float32) or fast (int8 activations, llama.cpp-style)",
        choices=("exact", "fast"),
    ),
    Knob("device", "str", "cpu", "where the model runs", choices=("cpu", "cuda")),
    Knob("cuda_graphs", "bool", True, "replay steps as CUDA graphs (off: eager, to debug)"),
    Knob(
        "cuda_pdl",
        "bool",
        True,
        "in a replayed step, launch each kernel as the blocks of the one before it exit "
        "(programmatic dependent launch, sm_90 and later; off: plain graph edges)",
    ),
    Knob(
        "cuda_split_attention_rows",
        "int",
        0,
        "a step's leading rows whose attention splits keys over blocks (decode kernels; a "
        "float32 scratch of rows x heads x max-model-len / 32 x head-dim); a longer step's other "
        "rows go to the prefill kernel (0: up to 256 as a 512 MiB scratch allows; never "
        "fewer than max-num-seqs)",
        0,
        1 << 16,
    ),
    Knob(
        "cuda_flash_prefill",
        "bool",
        False,
        "prompt rows past the decode kernels' attend on tensor cores (bf16 q and softmax "
        "weights, bf16 KV cache): much faster long prompts, but those rows lose the decode "
        "kernels' bits, so outputs then depend on batching and prompt chunking by rounding",
    ),
    Knob(
        "cuda_prefill_gemm",
        "str",
        "mma",
        "the tensor-core kernel of long steps' matmuls: mma (mma.sync) or wgmma (Hopper's "
        "warpgroup mma: an sm_90 GPU and matmul_input_dtype bfloat16; experimental)",
        choices=("mma", "wgmma"),
    ),
    Knob(
        "cuda_kquant_tensor_cores",
        "bool",
        False,
        "GGUF K-quant matrices (Q2_K .. Q6_K, K a multiple of 256) on the tensor cores at every "
        "step size, codes exact and scaled per tile (much faster batches and prompts); off: "
        "their GEMV kernels (experimental until measured on a card)",
    ),
    Knob("host", "str", "127.0.0.1", "address the HTTP server binds"),
    Knob("port", "int", 8000, "port the HTTP server binds", 0, 65535),
    Knob("max_body_bytes", "bytes", 4 << 20, "largest request body", 1024, 1 << 30),
    Knob("server_max_prompt_chars", "int", 200000, "longest prompt text", 1, 1 << 30),
    Knob("server_max_new_tokens", "int", 4096, "largest max_tokens a request may ask", 1, 1 << 24),
    Knob(
        "strict_request_fields",
        "bool",
        False,
        "refuse (400) request fields no API defines; off: they are ignored, named in a warning "
        "and the Vtllm-Ignored-Fields response header",
    ),
    Knob(
        "server_sse_ping_s",
        "float",
        15.0,
        "SSE keep-alive comment interval while waiting",
        0.1,
        3600,
    ),
    Knob("max_queued_requests", "int", 256, "waiting requests before new ones get 429", 1, 1 << 20),
    Knob(
        "max_queued_prompt_tokens",
        "int",
        131072,
        "prompt tokens waiting before new requests get 429 (one request alone always queues)",
        1,
        1 << 30,
    ),
    Knob(
        "drain_timeout_s",
        "float",
        30.0,
        "on SIGTERM, how long in-flight requests may finish",
        0,
        3600,
    ),
    Knob(
        "server_body_timeout_s",
        "float",
        30.0,
        "longest time a request body may take to arrive (then 408)",
        0.1,
        3600,
    ),
    Knob(
        "server_write_stall_timeout_s",
        "float",
        30.0,
        "a stream whose client reads nothing for this long is aborted, its KV blocks freed",
        0.1,
        3600,
    ),
    Knob(
        "server_send_buffer_bytes",
        "bytes",
        0,
        "kernel send buffer of each connection (0: the kernel's autotuning)",
        0,
        1 << 30,
    ),
    Knob(
        "engine_iteration_timeout_s",
        "float",
        60.0,
        "a step running longer marks the engine dead and exits (0: no watchdog)",
        0,
        86400,
    ),
    Knob("debug_faults", "bool", False, "serve POST /debug/fault to inject engine faults (tests)"),
    Knob(
        "debug_warmup_delay_s",
        "float",
        0.0,
        "hold the start-up warm-up forward this long (tests of start-up ordering)",
        0,
        600,
    ),
    Knob(
        "api_key", "str", None, "required as 'Authorization: Bearer KEY' on /v1 and tokenize routes"
    ),
    Knob(
        "cors_origins", "str", None, "comma-separated origins allowed by CORS (default: CORS off)"
    ),
    Knob(
        "log_level", "str", "info", "log verbosity", choices=("debug", "info", "warning", "error")
    ),
)
KNOBS_BY_NAME = {k.name: k for k in KNOBS}


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    model: str | None = None
    served_model_name: str | None = None
    embedding_model: str | None = None
    tool_call_parser: str = "auto"
    reasoning_parser: str | None = None
    max_model_len: int = 4096
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    kv_cache_memory: int = 0
    kv_cache_fraction: float = 0.2
    kv_cache_resident_memory: int = 0
    kv_cache_dtype: str = "auto"
    matmul_input_dtype: str = "auto"
    block_size: int = 16
    enable_prefix_caching: bool = True
    async_depth: int = 2
    shadow_check_rate: float = 0.0
    speculative_config: str | None = None  # JSON text, checked by parse_speculative_config
    tensor_parallel_size: int = 1
    distributed_executor_backend: str = "mp"
    data_parallel_size: int = 1
    cpu_threads: int = 0
    cpu_numerics: str = "exact"
    device: str = "cpu"
    cuda_graphs: bool = True
    cuda_pdl: bool = True
    cuda_split_attention_rows: int = 0
    cuda_flash_prefill: bool = False
    cuda_prefill_gemm: str = "mma"
    cuda_kquant_tensor_cores: bool = False
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 4 << 20
    server_max_prompt_chars: int = 200000
    server_max_new_tokens: int = 4096
    strict_request_fields: bool = False
    server_sse_ping_s: float = 15.0
    max_queued_requests: int = 256
    max_queued_prompt_tokens: int = 131072
    drain_timeout_s: float = 30.0
    server_body_timeout_s: float = 30.0
    server_write_stall_timeout_s: float = 30.0
    server_send_buffer_bytes: int = 0
    engine_iteration_timeout_s: float = 60.0
    debug_faults: bool = False
    debug_warmup_delay_s: float = 0.0
    api_key: str | None = None
    cors_origins: str | None = None
    log_level: str = "info"

    @property
    def speculative(self) -> "SpeculativeConfig | None":
        return parse_speculative_config(self.speculative_config)

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """served_model_name split at commas and blanks (empty: the model's own name)."""
        return tuple((self.served_model_name or "").replace(",", " ").split())


SPEC_DISABLE_BY_BATCH_SIZE = 8


class SpeculativeConfig(msgspec.Struct, frozen=True, kw_only=True):
    """--speculative-config, checked: k proposals per step, by n-gram prompt lookup or by a
    draft model (a checkpoint path) of the target's vocabulary."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    model: str | None = None  # draft_model's checkpoint
    # no drafts while this many requests run (vLLM's rule; docs/speculative_decoding.md)
    disable_by_batch_size: int = SPEC_DISABLE_BY_BATCH_SIZE


_SPEC_FIELDS = {
    "ngram": (
        "method",
        "num_speculative_tokens",
        "prompt_lookup_min",
        "prompt_lookup_max",
        "disable_by_batch_size",
    ),
    "draft_model": ("method", "num_speculative_tokens", "model", "disable_by_batch_size"),
}


def parse_speculative_config(
    text: str | None, source: str = "speculative_config"
) -> SpeculativeConfig | None:
    """The JSON text of speculative_config checked field by field (errors name `source`);
    unset prompt lookup sizes default as vLLM's do (both 5; one given: the other equals it)."""
    if text is None or not text.strip():
        return None

    def fail(message: str):
        raise InvalidParameter(f"{source}: {message}", param="speculative_config")

    try:
        raw = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        fail(f"not valid JSON ({exc})")
    if not isinstance(raw, dict):
        fail("must be a JSON object")
    method = raw.get("method")
    if method not in _SPEC_FIELDS:
        fail(f"method must be one of {', '.join(_SPEC_FIELDS)} (got {method!r})")
    known = _SPEC_FIELDS[method]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        fail(f"unknown field {unknown[0]!r} for method {method} (known: {', '.join(known)})")
    sizes = {}
    for field in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
        value = raw.get(field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            fail(f"{field} must be an integer (got {value!r})")
        sizes[field] = value
    k, lo, hi = sizes.values()
    if k is None or k < 1:
        fail(f"num_speculative_tokens must be an integer >= 1 (got {k!r})")
    disable = raw.get("disable_by_batch_size", SPEC_DISABLE_BY_BATCH_SIZE)
    if not isinstance(disable, int) or isinstance(disable, bool) or disable < 1:
        fail(f"disable_by_batch_size must be an integer >= 1 (got {disable!r})")
    if method == "draft_model":
        model = raw.get("model")
        if not isinstance(model, str) or not model.strip():
            fail(f"model must name the draft model's checkpoint (got {model!r})")
        return SpeculativeConfig(
            method=method, num_speculative_tokens=k, model=model, disable_by_batch_size=disable
        )
    if lo is None and hi is None:
        lo = hi = 5
    lo, hi = (hi if lo is None else lo), (lo if hi is None else hi)
    if lo < 1:
        fail(f"prompt_lookup_min must be >= 1 (got {lo})")
    if lo > hi:
        fail(f"prompt_lookup_min ({lo}) must not exceed prompt_lookup_max ({hi})")
    return SpeculativeConfig(
        method=method,
        num_speculative_tokens=k,
        prompt_lookup_min=lo,
        prompt_lookup_max=hi,
        disable_by_batch_size=disable,
    )


def _convert(knob: Knob, raw, source: str):
    try:
        if knob.type == "int":
            if isinstance(raw, bool) or (
                not isinstance(raw, int) and not str(raw).lstrip("-").isdigit()
            ):
                raise ValueError(f"not an integer: {raw!r}")
            value = int(raw)
        elif knob.type == "float":
            value = float(raw)
        elif knob.type == "bool":
            value = raw if isinstance(raw, bool) else parse_bool(str(raw))
        elif knob.type == "bytes":
            value = raw if isinstance(raw, int) else parse_bytes(str(raw))
        elif isinstance(raw, list | tuple):  # a `many` flag's values
            value = ",".join(str(r) for r in raw)
        elif isinstance(raw, dict):  # a JSON knob given as a dict (LLM(speculative_config=...))
            value = msgspec.json.encode(raw).decode()
        else:
            value = None if raw is None else str(raw)
    except ValueError as exc:
        raise InvalidParameter(f"{source}: {exc}", param=knob.name) from None
    if knob.lo is not None and value is not None and not knob.lo <= value <= knob.hi:
        raise InvalidParameter(
            f"{source}: {value} is outside [{knob.lo}, {knob.hi}]", param=knob.name
        )
    if knob.choices and value not in knob.choices:
        raise InvalidParameter(f"{source}: {value!r} is not one of {knob.choices}", param=knob.name)
    return value


def resolve(
    cli: dict | None = None, env: dict | None = None, **overrides
) -> tuple[EngineConfig, dict[str, str]]:
    """Merge defaults < environment < CLI < keyword overrides; return config and sources."""
    unknown = set(overrides) - set(KNOBS_BY_NAME)
    if unknown:
        raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
    env = os.environ if env is None else env
    values, sources = {}, {}
    for knob in KNOBS:
        value, source = knob.default, "default"
        if knob.env in env:
            value, source = _convert(knob, env[knob.env], knob.env), "env"
        if cli and cli.get(knob.name) is not None:
            value, source = _convert(knob, cli[knob.name], knob.flag), "cli"
        if overrides.get(knob.name) is not None:
            value, source = _convert(knob, overrides[knob.name], knob.name), "argument"
        values[knob.name], sources[knob.name] = value, source
    spec = KNOBS_BY_NAME["speculative_config"]  # a bad one fails here, naming its source
    where = {"cli": spec.flag, "env": spec.env}.get(sources[spec.name], spec.name)
    parse_speculative_config(values[spec.name], where)
    _check_tensor_parallel(values, sources)
    return EngineConfig(**values), sources


def _check_tensor_parallel(values: dict, sources: dict) -> None:
    """What tensor_parallel_size > 1 cannot run with, refused before a model loads (the model's
    own limits are checked once it is: models/sharding)."""
    n = values["tensor_parallel_size"]
    if n == 1 and values["distributed_executor_backend"] == "mp":
        return
    refusals = {  # on cuda, the GPUs and NCCL are checked at start (engine/build)
        "shadow_check_rate": values["shadow_check_rate"] > 0 and "runs without shadow checks",
        "speculative_config": values["speculative_config"] is not None
        and "runs without speculative decoding for now",
    }
    knob = KNOBS_BY_NAME["tensor_parallel_size"]
    where = {"cli": knob.flag, "env": knob.env}.get(sources[knob.name], knob.name)
    for reason in refusals.values():
        if reason:
            raise InvalidParameter(
                f"{where} {n} {reason} (docs/tensor_parallel.md)", param="tensor_parallel_size"
            )


# How --help groups the flags; every knob sits in exactly one group (tests/test_cli.py).
FLAG_GROUPS = (
    (
        "model",
        (
            "model",
            "served_model_name",
            "embedding_model",
            "device",
            "tool_call_parser",
            "reasoning_parser",
        ),
    ),
    (
        "engine",
        (
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "kv_cache_memory",
            "kv_cache_fraction",
            "kv_cache_resident_memory",
            "kv_cache_dtype",
            "block_size",
            "enable_prefix_caching",
            "async_depth",
            "shadow_check_rate",
            "speculative_config",
            "tensor_parallel_size",
            "distributed_executor_backend",
            "data_parallel_size",
            "engine_iteration_timeout_s",
        ),
    ),
    ("CPU", ("cpu_threads", "cpu_numerics")),
    (
        "CUDA",
        (
            "matmul_input_dtype",
            "cuda_graphs",
            "cuda_pdl",
            "cuda_split_attention_rows",
            "cuda_flash_prefill",
            "cuda_prefill_gemm",
            "cuda_kquant_tensor_cores",
        ),
    ),
    (
        "HTTP server",
        (
            "host",
            "port",
            "api_key",
            "cors_origins",
            "max_body_bytes",
            "server_max_prompt_chars",
            "server_max_new_tokens",
            "strict_request_fields",
            "server_sse_ping_s",
            "max_queued_requests",
            "max_queued_prompt_tokens",
            "drain_timeout_s",
            "server_body_timeout_s",
            "server_write_stall_timeout_s",
            "server_send_buffer_bytes",
        ),
    ),
    ("logging and debugging", ("log_level", "debug_faults", "debug_warmup_delay_s")),
)


def _metavar(knob: Knob) -> str:
    if knob.choices:
        return "{" + ",".join(knob.choices) + "}"
    if knob.type == "bool":
        return "{true,false}"
    if knob.type == "bytes":
        return "SIZE"  # parse_bytes: 4194304, 512M, 2GiB
    if knob.type == "float":
        return "SECONDS" if knob.name.endswith("_s") else "X"
    if knob.type == "int":
        return "N"
    return knob.name.rsplit("_", 1)[-1].upper()


def _shown_default(knob: Knob) -> str | None:
    if knob.default is None or (knob.type == "bytes" and knob.default == 0):
        return None  # the help says what happens by default
    if knob.type == "bytes" and knob.default % (1 << 20) == 0:
        return f"{knob.default >> 20}M"
    if knob.type == "float":
        return f"{knob.default:g}"
    return str(knob.default).lower() if knob.type == "bool" else str(knob.default)


def add_flags(parser: argparse.ArgumentParser, *, server: bool = True) -> None:
    """One flag per knob, grouped as FLAG_GROUPS; `server=False` leaves out the HTTP server's
    (commands that serve nothing; their VT_ variables are read all the same)."""
    for title, names in FLAG_GROUPS:
        if title == "HTTP server" and not server:
            continue
        group = parser.add_argument_group(title)
        for name in names:
            knob = KNOBS_BY_NAME[name]
            default = _shown_default(knob)
            where = f"env {knob.env}" + (f", default {default}" if default is not None else "")
            group.add_argument(
                knob.flag,
                dest=knob.name,
                default=None,
                nargs="+" if knob.many else None,
                metavar=_metavar(knob),
                help=f"{knob.help} [{where}]".replace("%", "%%"),
            )
