"""A model's tokenizer and chat template, read without transformers where that is exact.

Importing transformers' tokenizer classes costs about 0.65 s of a cached start, the largest part of
start-up left after torch. Most model directories hold what those classes would only wrap: a
tokenizer.json (the `tokenizers` library's own file), the special tokens by name, and a Jinja chat
template. For those, :class:`Tokenizer` does the same work with `tokenizers` and a sandboxed Jinja
environment with the extras chat templates are written against (``tojson`` without HTML escaping,
``raise_exception``, ``strftime_now``, loop controls). Anything else (a named tokenizer class, a
legacy special_tokens_map.json, space clean-up, several named templates) goes through
``AutoTokenizer``, which offers the same methods.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import jinja2

# tokenizer_class values that name the plain tokenizers-library tokenizer (v5's name, then v4's)
PLAIN_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")
# the named special tokens a chat template sees as variables (``{{ bos_token }}``)
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# transformers' own template tag (marks assistant text for training masks); plain Jinja lacks it
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


class TextTokenizer(Protocol):
    """What chatpage uses of a tokenizer: a :class:`Tokenizer`, or a transformers tokenizer
    (which has these and more)."""

    chat_template: str | None

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(
        self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False
    ) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> str | list[int]: ...


class Tokenizer:
    """Encoding, decoding and chat templating over a ``tokenizers.Tokenizer``; the subset of a
    transformers tokenizer's interface chatpage uses, with the same results."""

    def __init__(
        self, backend: Any, special_tokens: dict[str, str], chat_template: str | None
    ) -> None:
        # backend: a tokenizers.Tokenizer (the tokenizers package ships no type hints)
        self._backend = backend
        self._splitting: Any = None  # a copy of backend that reads special-token text as text
        self.special_tokens = special_tokens  # name (``eos_token``) -> token text
        self.chat_template = chat_template

    @property
    def backend_tokenizer(self) -> Any:
        """The ``tokenizers.Tokenizer`` itself (transformers' name for it)."""
        return self._backend

    def _token_id(self, name: str) -> int | None:
        token = self.special_tokens.get(name)
        if token is None:
            return None
        found: int | None = self._backend.token_to_id(token)
        return found

    @property
    def bos_token_id(self) -> int | None:
        return self._token_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._token_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._token_id("pad_token")

    def __len__(self) -> int:
        """The number of token ids, added tokens included (as ``len`` of a transformers one)."""
        size: int = self._backend.get_vocab_size(with_added_tokens=True)
        return size

    def encode(
        self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False
    ) -> list[int]:
        """The ids of ``text``: with the special tokens the tokenizer adds around a text
        (``add_special_tokens``), and with special-token text read as plain text
        (``split_special_tokens``: ``<|im_end|>`` as ``<``, ``|``...), as transformers' flags."""
        backend = self._backend
        if split_special_tokens:
            if self._splitting is None:  # a copy: the shared one's flag would race other threads
                from tokenizers import Tokenizer as Backend

                splitting = Backend.from_str(backend.to_str())
                splitting.encode_special_tokens = True
                self._splitting = splitting
            backend = self._splitting
        ids: list[int] = backend.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        text: str = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return text

    def save_pretrained(self, directory: str | Path) -> None:
        """Write the files `read_plain` reads back (transformers' names: a model folder)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self._backend.save(str(out / "tokenizer.json"))
        config = {"tokenizer_class": PLAIN_TOKENIZERS[0], **self.special_tokens}
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        tools: list[dict[str, Any]] | None = None,
        **variables: Any,
    ) -> str | list[int]:
        """``messages`` through the chat template, with the special tokens, ``tools`` and the
        template's own ``variables``; token ids (no special tokens added: the template writes
        them) unless ``tokenize`` is False."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        text = compile_template(self.chat_template).render(
            messages=messages,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **{**self.special_tokens, **variables},
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text


@functools.lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    """A chat template compiled in the sandbox chat templates are written for: they come with
    downloaded models, so they may not reach Python internals or change their arguments."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: object,
        ensure_ascii: bool = False,
        indent: int | str | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        # Jinja's own tojson escapes <, > and & for HTML, which would change the prompt's text
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: its text, or an object with its text."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def read_plain(directory: Path) -> Tokenizer | None:
    """The tokenizer in ``directory`` read directly, or None where only transformers reads it
    exactly: a named tokenizer class, no tokenizer.json, a special_tokens_map.json (whose
    precedence rules differ between transformers versions), space clean-up after decoding,
    several named chat templates, or a template using transformers' own ``generation`` tag."""
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (
        not isinstance(config, dict)
        or config.get("tokenizer_class") not in PLAIN_TOKENIZERS
        or config.get("clean_up_tokenization_spaces")
        or not (directory / "tokenizer.json").is_file()
        or (directory / "special_tokens_map.json").exists()
    ):
        return None
    template_file = directory / "chat_template.jinja"
    template = (
        template_file.read_text(encoding="utf-8")
        if template_file.is_file()
        else config.get("chat_template")
    )
    if template is not None and (not isinstance(template, str) or GENERATION_TAG.search(template)):
        return None
    from tokenizers import Tokenizer as Backend

    special = {
        name: text
        for name in SPECIAL_TOKEN_NAMES
        if (text := _token_text(config.get(name))) is not None
    }
    return Tokenizer(Backend.from_file(str(directory / "tokenizer.json")), special, template)
