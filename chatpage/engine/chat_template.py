"""The one place chat messages become prompt token ids (the tokenizer's chat template)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chatpage.engine.tokenizer import TextTokenizer


def render_prompt(tokenizer: TextTokenizer, messages: list[dict[str, Any]],
                  add_generation_prompt: bool = True,
                  tools: list[dict[str, Any]] | None = None) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template; ``tools`` (OpenAI's
    function tools) are the template's ``tools`` variable, as transformers passes them."""
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, tools=tools
    )
    if not isinstance(text, str):
        raise TypeError("apply_chat_template(tokenize=False) gave token ids, not text")
    return tokenizer.encode(text, add_special_tokens=False)


def continue_prompt(tokenizer: TextTokenizer, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None) -> list[int]:
    """Token ids that let the last message, a reply, go on: the conversation before it with
    the generation prompt (exactly as the reply was first asked for, so the prefix cache
    serves it), then the reply's text, left open (no end-of-turn)."""
    if not messages or messages[-1]["role"] != "assistant":
        raise ValueError("only a reply (the last message, from the assistant) can be continued")
    return (render_prompt(tokenizer, messages[:-1], tools=tools)
            + tokenizer.encode(messages[-1]["content"], add_special_tokens=False))


def system_prefix(tokenizer: TextTokenizer, system_prompt: str) -> list[int]:
    """The tokens every conversation with this system prompt starts with (a persona prefix)."""
    return render_prompt(tokenizer, [{"role": "system", "content": system_prompt}],
                         add_generation_prompt=False)
