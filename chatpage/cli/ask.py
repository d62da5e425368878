"""`chatpage ask`: one answer on stdout; piped input is context."""

from __future__ import annotations

import argparse
import queue
import sys
from typing import Any

from chatpage.chat.entry import ReplyStats
from chatpage.chat.replies import update_stats
from chatpage.cli.common import (
    add_backend_args,
    add_engine_args,
    remote_client,
    settings_or_warn,
    size_arg,
)
from chatpage.config.personas import default_persona, find_persona, load_personas
from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.config import EngineConfig
from chatpage.engine.outputs import RequestOutput, RequestUpdate
from chatpage.engine.protocol import ChatRequest
from chatpage.engine.sampling_params import SamplingParams
from chatpage.vocab import SAMPLING_RULES

CONNECT_S = 10.0
"""How long `ask --backend` waits for an unreachable server before giving up."""


def cmd_ask(args) -> int:
    import torch

    from chatpage.engine import LLMEngine
    from chatpage.engine.text.chat_template import render_prompt

    settings = settings_or_warn(args)
    personas, errors = load_personas()
    for err in errors:
        print(f"chatpage: warning: {err}", file=sys.stderr)
    if args.persona:
        persona = find_persona(personas, args.persona)
        if persona is None:
            names = ", ".join(p.name for p in personas)
            print(
                f"chatpage: error: no persona named {args.persona!r}; choose one of: {names}",
                file=sys.stderr,
            )
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
        params = _params(args, defaults)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        if settings.backend:
            return _ask_remote(args, settings, messages, params)
        config = EngineConfig.for_settings(settings, args.threads)
        torch.set_num_threads(config.threads)
        engine = LLMEngine.from_pretrained(settings.model, config)
        ids = render_prompt(engine.tokenizer, messages)
        rid = engine.add_request(ids, params, chat=True)
    except ValueError as e:  # bad sampling values, missing model, prompt too long, KV too small
        print(f"chatpage: error: {e}", file=sys.stderr)
        return 2
    outputs = OutputAccumulator()
    final = None
    while final is None:
        for update in engine.step():
            if update.request_id == rid:
                final = _show(update, outputs, params.width)
    engine.close()  # (the KV disk tier writes the prompt's blocks for the next run)
    described = []
    for c in final.outputs:
        score = f"score {c.score:.3f}, " if c.score is not None else ""
        described.append(
            (
                c.index,
                f"{score}logprob {c.cumulative_logprob:.2f}, "
                f"{len(c.token_ids)} tokens, {c.finish_reason}",
                c.text,
            )
        )
    code = _finish(final.error, params, described)
    _stats(args, final)  # (after the answer's own last line, on a line of its own)
    return code


def _stats(args: argparse.Namespace, final: RequestOutput) -> None:
    """With ``--stats``: the answer's stats line on stderr (the app's, under a reply: tokens,
    speed, first token, cache hits, speculative decoding's drafts accepted)."""
    if not args.stats or not final.outputs:
        return
    stats = ReplyStats()
    update_stats(stats, final, final.outputs[0])
    print(f"chatpage: {stats.line()}", file=sys.stderr)


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


def _ask_remote(args, settings, messages, params) -> int:
    """The same answer from the server at ``settings.backend`` (`--backend`)."""
    client = remote_client(settings)
    client.start()
    try:
        if not client.wait_ready(timeout=CONNECT_S):
            reason = client.error or client.status.text.split(";")[0]  # not retrying any more
            if reason.startswith("connecting"):  # the probe got no answer yet
                reason = f"{client.url} did not answer within {CONNECT_S:g} s"
            print(f"chatpage: error: {reason}", file=sys.stderr)
            return 1
        for note in client.warnings:
            print(f"chatpage: note: {note}", file=sys.stderr)
        updates: queue.SimpleQueue[RequestUpdate] = queue.SimpleQueue()
        client.submit(ChatRequest(messages, params), updates.put)
        outputs = OutputAccumulator()
        final = None
        while final is None:
            final = _show(updates.get(), outputs, params.width)
    finally:
        client.close()
    _stats(args, final)
    return _finish(
        final.error, params, [(c.index, str(c.finish_reason), c.text) for c in final.outputs]
    )


FLAGS = tuple(rule for rule in SAMPLING_RULES if rule.cli)
"""The sampling fields `ask` takes a flag for."""
_NOTES = {
    "n": "parallel samples, printed one after another",
    "beam_width": "beam search",
    "temperature": "default 0 (greedy); with --n, the persona's temperature",
}


def _params(args: argparse.Namespace, persona: dict[str, float | int]) -> SamplingParams:
    """Each field as its flag says, else as the persona does, else the chat default; except
    that one answer is greedy unless --temperature says otherwise (n samples need the
    persona's spread)."""
    values: dict[str, Any] = {}  # each of its rule's kind (checked by SamplingParams)
    for rule in SAMPLING_RULES:
        given = getattr(args, rule.field) if rule.cli else None
        choices = (given, persona.get(rule.field), rule.for_chat)
        values[rule.field] = next((v for v in choices if v is not None), None)
    if values["n"] == 1 and args.temperature is None:
        values["temperature"] = 0.0  # greedy
    return SamplingParams(**values)


def register(sub: argparse._SubParsersAction) -> None:
    ask = sub.add_parser("ask", help="answer one question on stdout (piped input is context)")
    ask.add_argument("question")
    ask.add_argument("--persona", help="persona name (see `chatpage personas`)")
    ask.add_argument("--system", help="system prompt (instead of the persona's)")
    ask.add_argument("--model", help="HF model directory or .gguf file")
    ask.add_argument("--kv-cache", type=size_arg, metavar="SIZE", help="KV cache budget")
    ask.add_argument(
        "--stats",
        action="store_true",
        help="after the answer, its stats on stderr: tokens, speed, cache hits, drafts accepted",
    )
    add_backend_args(ask, "ask an OpenAI-compatible server instead of the local engine")
    add_engine_args(ask)
    for rule in FLAGS:
        note = _NOTES.get(rule.field, rule.label)
        ask.add_argument(rule.cli, type=rule.kind, dest=rule.field, help=f"{note}: {rule.values}")
    ask.set_defaults(func=cmd_ask)
