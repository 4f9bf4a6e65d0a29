"""render_chat turns every way a template can fail on its input into TemplateError (a typed
400 naming messages), overflow and recursion included, so no caller has to know them."""

import pytest

from vtllm.models.chat_template import TemplateError, render_chat

MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("{% for i in range(10**9) %}x{% endfor %}", "range is too large"),  # OverflowError
        ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursed"),  # RecursionError
        ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
        ("{{ messages[0]['content'] + 1 }}", "failed to render"),  # TypeError
    ],
)
def test_template_failures_are_typed(source, said):
    with pytest.raises(TemplateError) as caught:
        render_chat(source, MSG)
    assert caught.value.param == "messages" and said in str(caught.value)
    assert caught.value.status == 400


def test_a_good_template_still_renders():
    assert render_chat(None, MSG).startswith("<|im_start|>user\nhi<|im_end|>")
