"""Seeded synthetic workloads shaped like the paper's traces, scaled down for a small CPU.

* ShareGPT-shaped: mean input 161.31, mean output 337.99 tokens (long, heavy-tailed answers).
* Alpaca-shaped: mean input 19.31, mean output 58.45 tokens (short instructions).

Lengths are log-normal, rescaled so the trace's means match ``scale`` times the paper's means,
then clipped so that prompt + output stays within ``scale * 2048`` (the paper filters ShareGPT to
sequences of at most 2048 tokens). Prompts are random token ids (the default: with ``ignore_eos``
and fixed output lengths the content does not change any memory or timing figure) or windows of
real text (the shipped personas' prompts, tokenized). Every request carries its true output
length; benchmarks decode exactly that many tokens (``ignore_eos=True``).

:func:`chat_sessions` builds a chat-shaped trace instead: sessions that each start from one of the
shipped personas' system prompts and go on for several user turns.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

PAPER_MAX_LEN = 2048
FIRST_ORDINARY_TOKEN = 100  # random prompts avoid the special tokens at the start of the vocab


@dataclass(frozen=True)
class TraceShape:
    """Length distribution of one trace (paper means at scale 1, log-normal spreads)."""

    name: str
    mean_input: float
    mean_output: float
    sigma_input: float
    sigma_output: float


SHAREGPT = TraceShape("sharegpt", 161.31, 337.99, sigma_input=1.0, sigma_output=0.8)
ALPACA = TraceShape("alpaca", 19.31, 58.45, sigma_input=0.55, sigma_output=0.7)
SHAPES = {s.name: s for s in (SHAREGPT, ALPACA)}


@dataclass(frozen=True)
class BenchRequest:
    """One request of a trace: prompt token ids, the output length it decodes, its arrival."""

    prompt_ids: list[int] = field(hash=False)
    output_len: int
    arrival_s: float = 0.0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len


def _lognormal_lengths(
    rng: random.Random, count: int, mean: float, sigma: float, low: int, high: int
) -> list[int]:
    """``count`` log-normal lengths rescaled to sample mean ``mean``, clipped to [low, high]."""
    mu = math.log(max(mean, 1e-6)) - sigma * sigma / 2
    raw = [rng.lognormvariate(mu, sigma) for _ in range(count)]
    factor = mean / (sum(raw) / count) if count else 1.0
    return [min(high, max(low, round(x * factor))) for x in raw]


def max_len_at(scale: float) -> int:
    """The clip on prompt + output length at ``scale`` (the paper's 2048, scaled)."""
    return max(32, round(PAPER_MAX_LEN * scale))


def make_trace(
    shape: TraceShape | str,
    num_requests: int,
    *,
    scale: float = 1.0,
    seed: int = 0,
    vocab_size: int = 49152,
    text_tokens: list[int] | None = None,
) -> list[BenchRequest]:
    """A seeded trace of ``num_requests`` requests shaped like ``shape`` at ``scale``.

    ``text_tokens``: when given, prompts are windows of this token stream (real text) instead of
    random token ids.
    """
    if isinstance(shape, str):
        shape = SHAPES[shape]
    if num_requests < 1:
        raise ValueError("a trace needs at least one request")
    rng = random.Random(f"{shape.name}:{seed}")
    limit = max_len_at(scale)
    inputs = _lognormal_lengths(
        rng, num_requests, shape.mean_input * scale, shape.sigma_input, 1, limit // 2
    )
    outputs = _lognormal_lengths(
        rng, num_requests, shape.mean_output * scale, shape.sigma_output, 1, limit - 1
    )
    requests = []
    for n_in, n_out in zip(inputs, outputs, strict=True):
        n_out = min(n_out, limit - n_in)
        if text_tokens:
            start = rng.randrange(len(text_tokens))
            ids = [text_tokens[(start + i) % len(text_tokens)] for i in range(n_in)]
        else:
            ids = [rng.randrange(FIRST_ORDINARY_TOKEN, vocab_size) for _ in range(n_in)]
        requests.append(BenchRequest(ids, n_out))
    return requests


def with_poisson_arrivals(
    requests: list[BenchRequest], rate: float, seed: int = 0
) -> list[BenchRequest]:
    """The same requests arriving as a Poisson process of ``rate`` requests per second."""
    rng = random.Random(f"poisson:{seed}:{rate}")
    t = 0.0
    timed = []
    for r in requests:
        t += rng.expovariate(rate)
        timed.append(replace(r, arrival_s=t))
    return timed


def describe(requests: list[BenchRequest]) -> dict:
    """Counts and means of a trace, for the JSON reports."""
    n = len(requests)
    return {
        "requests": n,
        "prompt_tokens": sum(r.prompt_len for r in requests),
        "output_tokens": sum(r.output_len for r in requests),
        "mean_input": round(sum(r.prompt_len for r in requests) / n, 1),
        "mean_output": round(sum(r.output_len for r in requests) / n, 1),
        "longest": max(r.total_len for r in requests),
    }


# -- chat-shaped trace --------------------------------------------------------------------------
_TOPICS = (
    "how a hash table grows",
    "the water cycle",
    "binary search",
    "compound interest",
    "why the sky is blue",
    "unit tests",
    "photosynthesis",
    "the TCP handshake",
    "a healthy breakfast",
    "git rebase",
    "the French revolution",
    "public key cryptography",
    "how vaccines work",
    "recursion",
    "plate tectonics",
    "a good cover letter",
)
_ASKS = (
    "Can you explain {topic} in a few sentences?",
    "What is the most common mistake people make about {topic}?",
    "Give me a short example of {topic}.",
    "How would you teach {topic} to a twelve year old?",
    "Summarize {topic} as three bullet points.",
    "What should I read next to learn more about {topic}?",
    "Is there a simpler way to think about {topic}?",
    "Thanks. One more question: how does that relate to {topic}?",
)


@dataclass
class ChatSession:
    """One chat: a persona's system prompt and the user's messages, turn by turn."""

    persona: str
    system_prompt: str
    user_turns: list[str]
    reply_tokens: list[int]  # how many tokens each assistant reply has


def persona_prompts() -> list[tuple[str, str]]:
    """(name, system prompt) of every shipped persona (user overrides are ignored)."""
    from chatpage.config.paths import shipped_personas_dir
    from chatpage.config.personas import load_personas

    personas, _errors = load_personas([shipped_personas_dir()])
    return [(p.name, p.system_prompt) for p in personas]


def chat_sessions(
    num_sessions: int,
    turns: int,
    *,
    num_personas: int | None = None,
    mean_reply: int = 48,
    seed: int = 0,
) -> list[ChatSession]:
    """``num_sessions`` chats over the first ``num_personas`` shipped personas (round robin)."""
    rng = random.Random(f"chat:{seed}")
    personas = persona_prompts()[: num_personas or None]
    sessions = []
    for i in range(num_sessions):
        name, system = personas[i % len(personas)]
        asks = [rng.choice(_ASKS).format(topic=rng.choice(_TOPICS)) for _ in range(turns)]
        replies = _lognormal_lengths(rng, turns, mean_reply, 0.5, 4, 4 * mean_reply)
        sessions.append(ChatSession(name, system, asks, replies))
    return sessions


def persona_text_tokens(tokenizer) -> list[int]:
    """The shipped personas' prompts as one token stream (source of real-text prompts)."""
    text = "\n\n".join(system for _name, system in persona_prompts())
    return tokenizer.encode(text, add_special_tokens=False)
