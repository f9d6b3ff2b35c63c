"""Render a model's own chat template (Jinja, as transformers does) and locate the continuation in the text.

No transformers import: the environment mirrors transformers' `_compile_jinja_template` (sandboxed, trim_blocks,
lstrip_blocks, loop controls, a no-op `{% generation %}` block) and the helpers it gives templates (raise_exception,
tojson, strftime_now, bos_token/eos_token and the other special-token variables).

The continuation's span is found by character offsets in one rendering of the whole conversation: the assistant turn
is rendered with a unique placeholder as its content, which is then replaced by the continuation verbatim. Templates
are not prefix-stable (a past assistant turn may render differently from the live one, e.g. Qwen3 strips <think>),
so nothing here assumes two renderings share text; sharing between contexts is found on token ids by the engine.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from fastscore.deps import require
from fastscore.errors import RequestError, TokenizationError
from fastscore.records import Message


ALLOWED_ROLES = ("system", "developer", "user", "assistant", "tool")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RenderedConversation:
    """A conversation rendered to text; `text[start:end]` is the continuation (the live assistant turn's content).

    `literal_spans`: character ranges of text from the user (special-token text in message contents, and the
    continuation) that must be tokenized as plain text, never as control tokens.
    """

    text: str
    start: int
    end: int
    literal_spans: tuple[tuple[int, int], ...] = ()

    @property
    def continuation(self) -> str:
        return self.text[self.start : self.end]


def check_messages(messages: Sequence[Message], request_id: object = None) -> None:
    for message in messages:
        if message.role not in ALLOWED_ROLES:
            raise RequestError(
                f"unknown role {message.role!r}; allowed roles: {', '.join(ALLOWED_ROLES)}", request_id=request_id
            )
        if not isinstance(message.content, str) and not (message.content is None and message.tool_calls):
            raise RequestError(f"message content must be a string, not {type(message.content).__name__}",
                               request_id=request_id)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' tojson: unlike Jinja's built-in one it does not HTML-escape, so JSON in prompts stays readable.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str):
    jinja2 = require("jinja2", "tokenizer")
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """`{% generation %}...{% endgeneration %}` marks assistant text for masks in transformers; renders as-is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise TokenizationError(f"the chat template does not parse: {exc}") from exc


def developer_as_system(template: str, messages: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """OpenAI's `developer` role (the newer name of `system`) for a template that never names it: rendered as
    `system`, which such a template knows; said once per template in the log."""
    if "developer" in template or not any(m.get("role") == "developer" for m in messages):
        return messages
    _say_developer_mapped(template)
    return [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]


@lru_cache(maxsize=16)
def _say_developer_mapped(template: str) -> None:
    log.warning("this model's chat template has no 'developer' role: developer messages are rendered as 'system'")


def render(
    template: str,
    messages: Sequence[Message | Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    special_tokens: Mapping[str, str | None] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    request_id: object = None,
    tools: Sequence[Any] = (),
) -> str:
    """The template's text for `messages`; `special_tokens` gives bos_token, eos_token, ... as template variables;
    `tools` (JSON schemas) reach the template as transformers' `tools=` does."""
    jinja2 = require("jinja2", "tokenizer")
    as_dicts = developer_as_system(template, [m if isinstance(m, Mapping) else m.template_dict() for m in messages])
    variables = {**(template_kwargs or {}), **(special_tokens or {})}
    try:
        # As transformers: no tools is `tools=None` (templates test `tools is not none`), never an empty list.
        return compile_template(template).render(
            messages=as_dicts, tools=list(tools) or None, documents=None,
            add_generation_prompt=add_generation_prompt, **variables
        )
    except (jinja2.exceptions.TemplateError, TypeError, ValueError, KeyError) as exc:
        raise RequestError(f"the chat template rejected the conversation: {exc}", request_id=request_id) from exc


def check_template_support(template: str, messages: Sequence[Message], tools: Sequence[Any],
                           request_id: object = None) -> None:
    """Refuse tool calls or tools that the template would drop without a trace (it never reads them)."""
    if tools and not re.search(r"\btools\b", template):
        raise RequestError("this model's chat template ignores 'tools': they would not reach the model",
                           request_id=request_id)
    if any(getattr(m, "tool_calls", ()) for m in messages) and "tool_calls" not in template:
        raise RequestError("this model's chat template does not render 'tool_calls': the call would vanish from "
                           "the conversation; write it as the assistant message's content instead",
                           request_id=request_id)


def _content_of(message: Message | Mapping[str, Any]):
    return message["content"] if isinstance(message, Mapping) else message.content


def render_literal(
    template: str,
    messages: Sequence[Message | Mapping[str, Any]],
    literal_texts: Sequence[str],
    **render_kwargs: Any,
) -> tuple[str, tuple[tuple[int, int], ...]]:
    """`render`, plus where the rendered text holds any of `literal_texts` (special-token texts) that came from a
    message's content rather than from the template. Each such occurrence is rendered through a unique marker, so
    the template's own special tokens and the user's look-alikes are told apart."""
    nonce = uuid.uuid4().hex
    markers = {f"\ue002{nonce}:{k}\ue003": text for k, text in enumerate(literal_texts)}
    if not markers or not any(t in str(_content_of(m)) for m in messages for t in literal_texts):
        return render(template, messages, **render_kwargs), ()
    protected = []
    for message in messages:
        as_dict = dict(message) if isinstance(message, Mapping) else message.template_dict()
        if isinstance(as_dict.get("content"), str):
            for marker, text in markers.items():  # longest texts first: <|im_end|> before a shorter prefix of it
                as_dict["content"] = as_dict["content"].replace(text, marker)
        protected.append(as_dict)
    rendered = render(template, protected, **render_kwargs)
    pattern = re.compile("|".join(re.escape(marker) for marker in markers))
    out, spans, cursor = [], [], 0
    for found in pattern.finditer(rendered):
        out.append(rendered[cursor : found.start()])
        start = sum(map(len, out))
        out.append(markers[found.group()])
        spans.append((start, start + len(markers[found.group()])))
        cursor = found.end()
    out.append(rendered[cursor:])
    return "".join(out), tuple(spans)


def render_with_continuation(
    template: str,
    messages: Sequence[Message],
    continuation: str,
    *,
    special_tokens: Mapping[str, str | None] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    request_id: object = None,
    literal_texts: Sequence[str] = (),
    tools: Sequence[Any] = (),
) -> RenderedConversation:
    """Render messages + the continuation as the assistant's reply once, and locate the continuation.

    The continuation is inserted verbatim: content transformations a template applies (strip, trim) act on the
    placeholder only, so the scored text is exactly the given continuation. `literal_texts` (the tokenizer's
    special-token texts) found in the messages' contents are marked in `literal_spans`, and so is the continuation.
    """
    check_template_support(template, messages, tools, request_id)
    placeholder = f"\ue000fastscore-{uuid.uuid4().hex}\ue001"
    probe = [*messages, Message("assistant", placeholder)]
    text, spans = render_literal(
        template,
        probe,
        literal_texts,
        add_generation_prompt=False,
        special_tokens=special_tokens,
        template_kwargs=template_kwargs,
        request_id=request_id,
        tools=tools,
    )
    count = text.count(placeholder)
    if count != 1:
        raise TokenizationError(
            f"the chat template rendered the assistant content {count} times (expected once): "
            "cannot locate the continuation"
        )
    start = text.index(placeholder)
    full = text[:start] + continuation + text[start + len(placeholder) :]
    shift = len(continuation) - len(placeholder)
    moved = tuple((a + shift, b + shift) if a >= start else (a, b) for a, b in spans)
    literal = tuple(sorted((*moved, (start, start + len(continuation)))))
    return RenderedConversation(full, start, start + len(continuation), literal)


def raw_text(prompt: str, continuation: str) -> RenderedConversation:
    """No template: the continuation right after the prompt, all of it user text (special-token text stays text)."""
    text = prompt + continuation
    return RenderedConversation(text, len(prompt), len(text), ((0, len(text)),) if text else ())


def text_after_assistant_content(
    template: str,
    *,
    special_tokens: Mapping[str, str | None] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """What the template writes right after an assistant reply (it starts with the end-of-turn token)."""
    rendered = render_with_continuation(
        template,
        (Message("user", "Hi"),),
        "Hello",
        special_tokens=special_tokens,
        template_kwargs=template_kwargs,
    )
    return rendered.text[rendered.end :]


def tool_call_text(
    template: str,
    messages: Sequence[Message],
    call: Mapping[str, Any],
    *,
    tools: Sequence[Any],
    special_tokens: Mapping[str, str | None] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The text the template writes for an assistant turn that makes `call` (an OpenAI tool call) after `messages`,
    as it would stand in the turn's content: what a model speaking the template's native tool format emits.

    Found as the difference between the turn rendered with the call and with a placeholder content; ValueError when
    the two renderings do not differ only there (the call's text could then not be scored as a continuation).
    """
    check_template_support(template, (Message("assistant", "", tool_calls=(call,)),), tools)
    placeholder = f"\ue000fastscore-{uuid.uuid4().hex}\ue001"
    kwargs = dict(add_generation_prompt=False, special_tokens=special_tokens, template_kwargs=template_kwargs,
                  tools=tools)
    with_content = render(template, [*messages, Message("assistant", placeholder)], **kwargs)
    with_call = render(template, [*messages, Message("assistant", "", tool_calls=(call,))], **kwargs)
    if with_content.count(placeholder) != 1:
        raise ValueError("the template does not render an assistant turn's content exactly once")
    prefix, suffix = with_content.split(placeholder)
    if not (with_call.startswith(prefix) and with_call.endswith(suffix)) or len(with_call) <= len(prefix + suffix):
        raise ValueError("the template renders a tool call elsewhere than where it renders an assistant's content")
    return with_call[len(prefix) : len(with_call) - len(suffix)]
