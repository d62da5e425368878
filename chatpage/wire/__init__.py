"""The OpenAI wire format, once, both ways: `chatpage serve` reads what `--backend` writes and
writes what it reads (request bodies, sampling fields, response bodies and stream chunks,
logprobs, SSE framing, errors). Free of torch, Starlette and httpx: the servers and clients
around it own the transport.

- `requests`: a request body <-> `ApiRequest` / what a client sends (`request_body`)
- `sampling`: request fields <-> `SamplingParams`, per server `Dialect`
- `chunks`: outputs <-> response bodies and chunks (`ChunkWriter`, `read_choice`), SSE
- `errors`: the error body and `ApiError`
"""
