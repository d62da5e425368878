"""OutputAccumulator: the one place that folds `RequestUpdate`s back into whole outputs.

`LLMEngine.generate` answers with what it folds; the chat folds a reply's or an alternative's
updates into its text with it, and `chatpage serve` its non-streamed responses. A delta is
appended to its output (a tool call's pieces to that call), a rewrite (beam search) replaces
it; a failed request's outputs that
had not ended end with FinishReason.ERROR. Once a beam search finishes, only the outputs its
final update names are kept (its hypotheses), the live beams seen before are gone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from chatpage.engine.outputs import (
    CompletionOutput,
    OutputDelta,
    RequestOutput,
    RequestUpdate,
    ToolCall,
    ToolCallDelta,
    Usage,
    new_call_id,
)
from chatpage.vocab import FinishReason


class OutputAccumulator:
    """Folds the updates of any number of requests; forgets a request once it finished."""

    def __init__(self) -> None:
        self._outputs: dict[str, RequestOutput] = {}

    def add(self, update: RequestUpdate) -> RequestOutput:
        """Fold ``update`` in; returns its request's outputs so far (the same object for every
        update of a request, changed in place; complete once ``finished``)."""
        out = self._outputs.get(update.request_id)
        if out is None:
            out = self._outputs[update.request_id] = RequestOutput(
                update.request_id, [], False, Usage()
            )
        by_index = {c.index: c for c in out.outputs}
        for delta in update.outputs:
            c = by_index.get(delta.index)
            if c is None:
                c = by_index[delta.index] = CompletionOutput(delta.index, [], "", 0.0)
            _fold(c, delta)
        if update.finished:
            del self._outputs[update.request_id]
            if any(d.rewrite for d in update.outputs):  # the final beams replace the live ones
                named = {d.index for d in update.outputs}
                by_index = {i: c for i, c in by_index.items() if i in named}
            if update.error is not None:
                for c in by_index.values():
                    c.finish_reason = c.finish_reason or FinishReason.ERROR
        out.outputs = [by_index[i] for i in sorted(by_index)]
        out.finished = update.finished
        out.usage = update.usage
        out.ttft_s = update.ttft_s if update.ttft_s is not None else out.ttft_s
        out.elapsed_s = update.elapsed_s
        out.error = update.error
        return out

    def forget(self, request_id: str) -> None:
        """Drop a request that will send nothing more (its client went away)."""
        self._outputs.pop(request_id, None)


def _fold(c: CompletionOutput, d: OutputDelta) -> None:
    """Append ``d`` to ``c``, or (a rewrite) replace ``c``'s text, tokens and logprobs."""
    if d.rewrite:
        c.text, c.token_ids, c.num_tokens = d.text, list(d.token_ids), d.num_tokens
        c.reasoning = d.reasoning
        c.tool_calls = add_tool_calls([], d.tool_calls)
        c.logprobs = list(d.logprobs) if d.logprobs is not None else None
        c.top_logprobs = list(d.top_logprobs) if d.top_logprobs is not None else None
    else:
        c.text += d.text
        c.reasoning += d.reasoning
        c.tool_calls = add_tool_calls(c.tool_calls, d.tool_calls)
        c.token_ids += d.token_ids
        c.num_tokens += d.num_tokens
        if d.logprobs is not None:
            c.logprobs = c.logprobs if c.logprobs is not None else []
            c.logprobs += d.logprobs
        if d.top_logprobs is not None:
            c.top_logprobs = c.top_logprobs if c.top_logprobs is not None else []
            c.top_logprobs += d.top_logprobs
    if d.rewrite or d.num_tokens:  # (an end without tokens leaves the sum as it was)
        c.cumulative_logprob = d.cumulative_logprob
    c.score = d.score if d.score is not None else c.score
    c.finish_reason = d.finish_reason or c.finish_reason


def add_tool_calls(calls: list[ToolCall], deltas: Iterable[ToolCallDelta]) -> list[ToolCall]:
    """``calls`` with ``deltas`` folded in: a delta naming a call it does not hold yet begins
    that call, the others extend their call's arguments."""
    for d in deltas:
        if d.index < len(calls):
            call = calls[d.index]
            calls[d.index] = replace(call, arguments=call.arguments + d.arguments)
        else:
            calls.append(ToolCall(d.name, d.arguments, d.id or new_call_id()))
    return calls
