"""`python -m vtllm config`: every knob, its value and where the value came from."""

from vtllm import config


def run_config(args) -> int:
    cli = {k.name: getattr(args, k.name, None) for k in config.KNOBS}
    engine_config, sources = config.resolve(cli)
    width = max(len(k.name) for k in config.KNOBS)
    for knob in config.KNOBS:
        value = getattr(engine_config, knob.name)
        source = sources[knob.name]
        print(f"{knob.name:<{width}}  {value!s:<12} {source:<8} {knob.env:<28} {knob.help}")
    return 0
