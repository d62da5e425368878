"""The soak's serve phase: ordinary requests through a real `chatpage serve` (the soak's tiny
Llama, keyless, on a free local port) with hostile ones mixed in, all at once: logit_bias keys
past int64, outside the vocabulary or not ASCII digits, a JSON schema too big to compile soon,
n x max_tokens x top_logprobs past its cap, and a Host header that is not the server's.

Every hostile request must be refused with a 4xx (``hostile_not_refused`` counts the others)
and every ordinary one must end as asked, with no error (``failed_by_others`` counts those that
did not): one request must never fail another.
"""

from __future__ import annotations

import random
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from chatpage.engine import EngineConfig
from chatpage.engine.client import LocalEngineClient
from chatpage.engine.load.loader import LoadedModel
from chatpage.engine.sampling_params import MAX_LOGPROB_ENTRIES
from chatpage.vocab import MAX_LOGPROBS

HOSTILE_SHARE = 0.25
IN_FLIGHT = 8
KV_CACHE_BYTES = 16 << 20
PROMPT = [5, 17, 101, 256, 33]  # (token ids: the tiny Llama reads the first 512 ids only)
PATH = "/v1/completions"


def _hostile(vocab: int, context: int) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """(path, body, headers) of each hostile request to a model of ``vocab`` tokens and a
    context of ``context``."""
    n = MAX_LOGPROB_ENTRIES // ((context - len(PROMPT) - 1) * (MAX_LOGPROBS + 1)) + 1
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(10_000)}}
    bodies: list[dict[str, Any]] = [
        {"logit_bias": {key: 1}} for key in ("9" * 20, str(2**63), "²", "9" * 5000, str(vocab))
    ]
    bodies += [
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": schema},
            }
        },
        {"n": n, "max_tokens": 100_000, "logprobs": MAX_LOGPROBS},
    ]
    requests: list[tuple[str, dict[str, Any], dict[str, str]]] = [
        (PATH, {"prompt": PROMPT, **body}, {}) for body in bodies
    ]
    requests.append((PATH, {"prompt": PROMPT}, {"Host": "evil.example"}))
    requests.append(("/metrics", {}, {"Host": "evil.example"}))
    return requests


def _ordinary(rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": rng.randint(1, 16)}
    kind = rng.choice(("greedy", "sampled", "n", "stream", "beam"))
    if kind == "greedy":
        body["temperature"] = 0
    elif kind == "sampled":
        body.update(temperature=0.8, top_p=0.9, seed=rng.randrange(1000))
    elif kind == "n":
        body.update(n=rng.randint(2, 3), seed=rng.randrange(1000), logprobs=2)
    elif kind == "stream":
        body.update(stream=True, ignore_eos=True, logit_bias={str(rng.randrange(3, 500)): 5})
    else:
        body.update(n=2, use_beam_search=True, temperature=0)
    return body


def _send(url: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bool]:
    """(the status, whether the answer carried an error)."""
    with httpx.Client(base_url=url, timeout=300) as http:
        if path == "/metrics":
            r = http.get(path, headers=headers)
            return r.status_code, r.status_code != 200
        r = http.post(path, json=body, headers=headers)
        unfinished = bool(body.get("stream")) and "[DONE]" not in r.text
        return r.status_code, '"error"' in r.text or unfinished


def run(loaded: LoadedModel, requests: int, seed: int = 0) -> dict[str, Any]:
    """``requests`` requests (about `HOSTILE_SHARE` of them hostile) through a real server."""
    from transformers import LlamaForCausalLM

    from chatpage.serve import build_app
    from chatpage.serve.threaded import serving

    rng = random.Random(seed)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="chatpage-soak-") as tmp:
        model = LlamaForCausalLM(loaded.config)  # type: ignore[arg-type]  # (a LlamaConfig)
        model.load_state_dict(dict(loaded.state))
        model.save_pretrained(tmp)
        tokenizer: Any = loaded.tokenizer  # (the soak's: a transformers tokenizer)
        tokenizer.save_pretrained(tmp)
        client = LocalEngineClient(tmp, EngineConfig(kv_cache_bytes=KV_CACHE_BYTES))
        client.start()
        if not client.wait_ready(300):
            raise RuntimeError(f"the soak's server did not load its model: {client.error}")
        try:
            with serving(build_app(client)) as server:
                hostile = _hostile(loaded.config.vocab_size, client.max_model_len)
                result = _drive(server.url, requests, rng, hostile)
        finally:
            client.close()
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def _drive(url: str, requests: int, rng: random.Random, hostile: list) -> dict[str, Any]:
    plan = [
        (True, *rng.choice(hostile))
        if rng.random() < HOSTILE_SHARE
        else (False, PATH, _ordinary(rng), {})
        for _ in range(requests)
    ]
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        answers = list(pool.map(lambda p: _send(url, *p[1:]), plan))
    tally = {"requests": requests, "hostile": 0, "hostile_not_refused": 0, "failed_by_others": 0}
    for (odd, *_), (status, error) in zip(plan, answers, strict=True):
        if odd:
            tally["hostile"] += 1
            tally["hostile_not_refused"] += not 400 <= status < 500
        else:
            tally["failed_by_others"] += status != 200 or bool(error)
    return tally
