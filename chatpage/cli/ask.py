"""`chatpage ask`: one answer on stdout; piped input is context."""

from __future__ import annotations

import argparse
import queue
import sys

from chatpage.cli.common import (
    add_engine_args,
    engine_config,
    remote_client,
    settings_or_warn,
    size_arg,
)
from chatpage.config.personas import default_persona, find_persona, load_personas
from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.outputs import RequestOutput, RequestUpdate

CONNECT_S = 10.0
"""How long `ask --backend` waits for an unreachable server before giving up."""


def cmd_ask(args) -> int:
    import torch

    from chatpage.engine import LLMEngine, SamplingParams
    from chatpage.engine.chat_template import render_prompt

    settings = settings_or_warn(args)
    personas, errors = load_personas()
    for err in errors:
        print(f"chatpage: warning: {err}", file=sys.stderr)
    if args.persona:
        persona = find_persona(personas, args.persona)
        if persona is None:
            names = ", ".join(p.name for p in personas)
            print(f"chatpage: error: no persona named {args.persona!r}; choose one of: {names}",
                  file=sys.stderr)
            return 2
    else:
        persona = default_persona(personas, settings.default_persona)
    system = args.system if args.system is not None else persona.system_prompt
    defaults = persona.sampling() if args.system is None or args.persona else {}
    question = args.question
    if not sys.stdin.isatty():
        context = sys.stdin.read()
        if context.strip():
            question = f"{context.rstrip()}\n\n{question}"
    try:
        params = SamplingParams(
            n=args.n, beam_width=args.beam,
            # one answer is greedy unless asked otherwise; n samples need the persona's spread
            temperature=_pick(args.temperature,
                              defaults.get("temperature", 0.8) if args.n > 1 else None, 0.0),
            top_p=_pick(args.top_p, defaults.get("top_p"), 1.0),
            top_k=_pick(None, defaults.get("top_k"), 0),
            seed=_pick(args.seed, defaults.get("seed"), None),
            max_tokens=_pick(args.max_tokens, defaults.get("max_tokens"), 512),
        )
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        if settings.backend:
            return _ask_remote(settings, messages, params)
        config = engine_config(settings, args.threads)
        torch.set_num_threads(config.threads)
        engine = LLMEngine.from_pretrained(settings.model, config)
        ids = render_prompt(engine.tokenizer, messages)
        rid = engine.add_request(ids, params)
    except ValueError as e:  # bad sampling values, missing model, prompt too long, KV too small
        print(f"chatpage: error: {e}", file=sys.stderr)
        return 2
    outputs = OutputAccumulator()
    final = None
    while final is None:
        for update in engine.step():
            if update.request_id == rid:
                final = _show(update, outputs, params.width)
    described = []
    for c in final.outputs:
        score = f"score {c.score:.3f}, " if c.score is not None else ""
        described.append((c.index, f"{score}logprob {c.cumulative_logprob:.2f}, "
                                   f"{len(c.token_ids)} tokens, {c.finish_reason}", c.text))
    return _finish(final.error, params, described)


def _show(update: RequestUpdate, outputs: OutputAccumulator, width: int) -> RequestOutput | None:
    """Print a single answer's new text as it comes; returns the outputs once finished."""
    if width == 1:
        text = "".join(d.text for d in update.outputs)
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
    out = outputs.add(update)
    return out if out.finished else None


def _finish(error: str | None, params, outputs: list[tuple[int, str, str]]) -> int:
    """End the streamed answer, or print the samples/beams: (index, details, text) each."""
    if error:
        print(f"\nchatpage: error: {error}", file=sys.stderr)
        return 1
    if params.width == 1:
        sys.stdout.write("\n")
        return 0
    label = "beam" if params.use_beam_search else "sample"
    for index, details, text in outputs:
        print(f"--- {label} {index + 1} ({details})")
        print(text)
    return 0


def _ask_remote(settings, messages, params) -> int:
    """The same answer from the server at ``settings.backend`` (`--backend`)."""
    client = remote_client(settings)
    client.start()
    try:
        if not client.wait_ready(timeout=CONNECT_S):
            reason = client.error or client.status.split(";")[0]  # not retrying any more
            print(f"chatpage: error: {reason}", file=sys.stderr)
            return 1
        for note in client.warnings:
            print(f"chatpage: note: {note}", file=sys.stderr)
        updates: queue.SimpleQueue[RequestUpdate] = queue.SimpleQueue()
        client.submit(messages, params, updates.put)
        outputs = OutputAccumulator()
        final = None
        while final is None:
            final = _show(updates.get(), outputs, params.width)
    finally:
        client.close()
    return _finish(final.error, params,
                   [(c.index, str(c.finish_reason), c.text) for c in final.outputs])


def _pick(given, persona_value, fallback):
    if given is not None:
        return given
    return persona_value if persona_value is not None else fallback


def register(sub: argparse._SubParsersAction) -> None:
    ask = sub.add_parser("ask", help="answer one question on stdout (piped input is context)")
    ask.add_argument("question")
    ask.add_argument("--persona", help="persona name (see `chatpage personas`)")
    ask.add_argument("--system", help="system prompt (instead of the persona's)")
    ask.add_argument("--model", help="HF model directory or .gguf file")
    ask.add_argument("--kv-cache", type=size_arg, metavar="SIZE", help="KV cache budget")
    ask.add_argument("--backend", metavar="URL",
                     help="ask an OpenAI-compatible server instead of the local engine")
    add_engine_args(ask)
    ask.add_argument("--max-tokens", type=int)
    ask.add_argument("--temperature", type=float,
                     help="default 0 (greedy); with --n, the persona's temperature")
    ask.add_argument("--top-p", type=float)
    ask.add_argument("--seed", type=int)
    ask.add_argument("--n", type=int, default=1, help="parallel samples, printed one after another")
    ask.add_argument("--beam", type=int, default=0, metavar="K", help="beam search of width K")
    ask.set_defaults(func=cmd_ask)
