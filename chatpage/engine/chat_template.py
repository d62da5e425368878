"""The one place chat messages become prompt token ids (the tokenizer's chat template)."""

from __future__ import annotations


def render_prompt(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool = True
                  ) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template."""
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    return tokenizer.encode(text, add_special_tokens=False)


def system_prefix(tokenizer, system_prompt: str) -> list[int]:
    """The tokens every conversation with this system prompt starts with (a persona prefix)."""
    return render_prompt(tokenizer, [{"role": "system", "content": system_prompt}],
                         add_generation_prompt=False)
