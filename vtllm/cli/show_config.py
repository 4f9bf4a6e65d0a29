"""`python -m vtllm config`: every knob, its value and where the value came from."""

from vtllm import config


def _number(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def knob_table_markdown() -> str:
    """The README's knob table, generated here so it cannot drift from config.py."""
    rows = ["| flag | env | default | range | what |", "|---|---|---|---|---|"]
    for knob in config.KNOBS:
        if knob.choices:
            span = " / ".join(knob.choices)
        elif knob.lo is not None:
            span = f"{_number(knob.lo)} .. {_number(knob.hi)}"
        else:
            span = ""
        default = "" if knob.default is None else f"`{knob.default}`"
        rows.append(f"| `{knob.flag}` | `{knob.env}` | {default} | {span} | {knob.help} |")
    return "\n".join(rows) + "\n"


def run_config(args) -> int:
    if args.markdown:
        print(knob_table_markdown(), end="")
        return 0
    cli = {k.name: getattr(args, k.name, None) for k in config.KNOBS}
    engine_config, sources = config.resolve(cli)
    width = max(len(k.name) for k in config.KNOBS)
    for knob in config.KNOBS:
        value = getattr(engine_config, knob.name)
        if knob.secret and value:
            value = "(set)"
        source = sources[knob.name]
        print(f"{knob.name:<{width}}  {value!s:<12} {source:<8} {knob.env:<28} {knob.help}")
    return 0
