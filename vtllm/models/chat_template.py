"""Chat templates rendered in a jinja2 sandbox, with the helpers HF templates expect."""

from datetime import datetime
from functools import lru_cache

from vtllm.errors import InvalidParameter

# Used when a model ships no template: ChatML, which many instruct models understand.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class TemplateError(InvalidParameter):
    pass


def _raise_exception(message):
    raise TemplateError(f"chat template: {message}", param="messages")


@lru_cache(maxsize=8)
def _compile(source: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


@lru_cache(maxsize=8)
def template_variables(template: str | None) -> frozenset[str]:
    """The variables a template reads from its caller (`tools` tells whether it knows tools)."""
    from jinja2 import meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    try:
        return frozenset(meta.find_undeclared_variables(env.parse(template or CHATML)))
    except Exception:  # a template that does not parse fails when rendered, with its 400
        return frozenset()


def render_chat(
    template: str | None,
    messages: list[dict],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict] | None = None,
    extra: dict | None = None,
) -> str:
    """`tools` and `extra` (a request's chat_template_kwargs) as HF's apply_chat_template
    passes them; `extra` never overrides the other variables."""
    from jinja2 import TemplateError as JinjaError
    from jinja2.exceptions import SecurityError

    try:
        return _compile(template or CHATML).render(
            {
                **(extra or {}),
                "messages": messages,
                "add_generation_prompt": add_generation_prompt,
                "bos_token": bos_token,
                "eos_token": eos_token,
                "tools": tools,
            }
        )
    except TemplateError:
        raise
    except (JinjaError, SecurityError, TypeError, ValueError) as exc:
        raise TemplateError(f"chat template failed to render: {exc}", param="messages") from None
    # The sandbox's range() cap raises OverflowError; a template that recurses (a macro calling
    # itself) exhausts the stack; a template that multiplies its input can exhaust memory.
    # Each is the template's failure on this input: the same typed 400, never a 500.
    except OverflowError:
        raise TemplateError(
            "chat template failed to render: a range is too large", param="messages"
        ) from None
    except RecursionError:
        raise TemplateError(
            "chat template failed to render: it recursed too deeply", param="messages"
        ) from None
    except MemoryError:
        raise TemplateError(
            "chat template failed to render: out of memory", param="messages"
        ) from None


def cut_after_final(text: str, final: str) -> str:
    """continue_final_message: the rendered chat (without a generation prompt) cut right after
    the final message's text, so that no end-of-turn marker follows and the model continues
    that message. As transformers cuts it (vLLM's behaviour): at the text's last occurrence,
    its surrounding whitespace stripped."""
    content = final.strip()
    at = text.rfind(content) if content else -1
    if at < 0:
        raise TemplateError(
            "continue_final_message: the final message's text must be non-empty and appear "
            "verbatim in the rendered chat",
            param="continue_final_message",
        )
    return text[: at + len(content)]
