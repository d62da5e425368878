"""`chatpage bench structured`: decoding under a JSON-schema grammar against free decoding.

At 1 and 32 rows, the same chat prompt decodes ``--tokens`` tokens three times on one engine:
free and under a JSON schema (a long list of records, so the grammar never completes before the
token limit and every run decodes the same number of tokens), one token a step (speculation
off), then under the schema with speculative decoding (the tokens the grammar forces drafted:
`engine/core/speculate.py`). Reported per row count: decode tok/s of each (the prefill step
left out), the schema's over free decoding (goal >= 0.9), speculation's over the schema's
without, and the share of the constrained steps spent computing and applying the token masks
(goal <= 0.1 at 32 rows), all times by the one benchmark clock (`common.now`: CPU time on one
thread).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from chatpage.bench import common
from chatpage.bench.reporting import Goal, Section, at_least, at_most, reader, table
from chatpage.engine import SamplingParams
from chatpage.engine.load.loader import load_model
from chatpage.engine.sampling_params import GrammarKind, Structured
from chatpage.engine.text.chat_template import render_prompt
from chatpage.vocab import DEFAULT_WEIGHTS, WEIGHT_FORMATS

ROWS = (1, 32)
GOAL_RATIO = 0.9  # JSON-schema decode tok/s over free decoding, at every row count
GOAL_MASK_SHARE = 0.1  # the masks' share of a constrained step, at the most rows
SCHEMA = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "minItems": 500,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "city": {"type": "string", "maxLength": 16},
                },
                "required": ["name", "age", "city"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["people"],
    "additionalProperties": False,
}
PROMPT = [{"role": "user", "content": "List people with their name, age and city as JSON."}]


def decode_rate(
    eng,
    prompt: list[int],
    rows: int,
    tokens: int,
    structured: Structured | None,
    speculate: bool = False,
) -> dict:
    """Decode ``rows`` requests of ``prompt`` for ``tokens`` tokens each; decode tok/s (the
    first, prefill step left out) and the mask seconds of the decode steps."""
    for i in range(rows):
        eng.add_request(
            prompt,
            SamplingParams(
                temperature=0.8,
                seed=i,
                max_tokens=tokens,
                ignore_eos=True,
                structured=structured,
                speculate=speculate,
            ),
        )

    seqs = [s for g in eng.groups.values() for s in g.seqs]
    eng.step()  # the prefill (a speculating request's prompt tail is a step of its own)
    while any(s.num_output_tokens == 0 for s in seqs):
        eng.step()
    # (decode tokens: those of the prefill steps are not timed)
    mask0, decoded = eng.constraints.mask_seconds, -sum(s.num_output_tokens for s in seqs)
    t0 = common.now()
    while eng.has_unfinished():
        decoded += sum(u.usage.completion_tokens for u in eng.step() if u.finished)
    seconds = common.now() - t0
    return {
        "tok_s": decoded / seconds,
        "seconds": seconds,
        "mask_s": eng.constraints.mask_seconds - mask0,
    }


def main(argv: list[str] | None = None) -> int:
    p = common.parser("structured", "decoding under a JSON-schema grammar vs free", 1.0)
    p.add_argument("--tokens", type=int, default=48, help="tokens decoded per row")
    p.add_argument(
        "--weights",
        choices=WEIGHT_FORMATS,
        default=DEFAULT_WEIGHTS,
        help=f"weight format (default {DEFAULT_WEIGHTS}, the app's)",
    )
    args = common.parse(p, argv)
    tokens = max(4, int(args.tokens * args.scale))
    common.say(f"loading {args.model or 'the default model'}")
    loaded = load_model(args.model, progress=common.say, weights=args.weights)
    eng = common.engine(loaded, weight_dtype=args.weights, kv_cache_bytes=256 << 20)
    eng.constraints.clock = common.now  # the masks by the clock the steps are timed by
    prompt = render_prompt(eng.tokenizer, PROMPT)
    spec = Structured(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA))
    decode_rate(eng, prompt, 2, 4, spec)  # warm: kernels, llguidance's tokenizer, the grammar
    results = []
    for rows in ROWS:
        free = decode_rate(eng, prompt, rows, tokens, None)
        constrained = decode_rate(eng, prompt, rows, tokens, spec)
        drafted = decode_rate(eng, prompt, rows, tokens, spec, speculate=True)
        row = {
            "rows": rows,
            "free_tok_s": free["tok_s"],
            "json_schema_tok_s": constrained["tok_s"],
            "ratio": constrained["tok_s"] / free["tok_s"],
            "speculating_tok_s": drafted["tok_s"],
            "speculation_ratio": drafted["tok_s"] / constrained["tok_s"],
            "mask_share": constrained["mask_s"] / constrained["seconds"],
            "decode_steps": tokens - 1,
            "mask_ms_per_step": constrained["mask_s"] / max(tokens - 1, 1) * 1e3,
            "json_schema_ms_per_step": constrained["seconds"] / max(tokens - 1, 1) * 1e3,
        }
        common.say(
            f"{rows} rows: free {row['free_tok_s']:.1f} tok/s, json schema "
            f"{row['json_schema_tok_s']:.1f} tok/s (ratio {row['ratio']:.3f}), masks "
            f"{row['mask_share']:.1%} of a step; speculating {row['speculating_tok_s']:.1f} tok/s"
        )
        results.append(row)
    result = {
        "benchmark": "structured",
        "tokens": tokens,
        "weights": args.weights,
        **common.model_info(loaded),
        "grammar_engine": "llguidance",
        "results": results,
        "goals": {"ratio": GOAL_RATIO, "mask_share_32_rows": GOAL_MASK_SHARE},
    }
    return common.emit(common.round_floats(result), args.json)


# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowsFigures:
    rows: int
    free_tok_s: float
    json_schema_tok_s: float
    ratio: float
    mask_share: float
    mask_ms_per_step: float
    speculating_tok_s: float | None = None  # (runs before speculation drafted under grammars)
    speculation_ratio: float | None = None


@dataclass(frozen=True)
class StructuredResult:
    """What the report reads of a run's JSON."""

    tokens: int
    weights: str
    grammar_engine: str
    results: list[RowsFigures]


def goals(g: StructuredResult) -> list[Goal]:
    rows = [
        at_least(
            "structured",
            f"JSON-schema / free decode tok/s, {row.rows} row(s)",
            row.ratio,
            GOAL_RATIO,
            f"{row.json_schema_tok_s:.1f} against {row.free_tok_s:.1f} tok/s; the masks "
            f"take {row.mask_ms_per_step:.2f} ms a step ({g.grammar_engine})",
        )
        for row in g.results
    ]
    wide = max(g.results, key=lambda r: r.rows)
    rows.append(
        at_most(
            "structured",
            f"mask time / decode step, {wide.rows} rows",
            wide.mask_share,
            GOAL_MASK_SHARE,
            "the rows' masks are computed together, in parallel, into one bitmask, then applied "
            "to the logits in one masked fill",
        )
    )
    return rows


def figures(r: StructuredResult) -> list[str]:
    rows = [
        [
            x.rows,
            x.free_tok_s,
            x.json_schema_tok_s,
            x.ratio,
            100 * x.mask_share,
            "-" if x.speculating_tok_s is None else x.speculating_tok_s,
            "-" if x.speculation_ratio is None else x.speculation_ratio,
        ]
        for x in r.results
    ]
    head = ["rows", "free tok/s", "JSON schema tok/s", "ratio", "masks (% of step)"]
    return [
        f"{r.tokens} tokens per row, {r.weights} weights, grammars by {r.grammar_engine}; "
        "speculation off but in the last two columns (the schema's run again, drafting).",
        "",
        table([*head, "speculating tok/s", "speculating / not"], rows),
    ]


SECTION = Section(reader(StructuredResult), goals, figures)
