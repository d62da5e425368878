"""`--backend URL`: chatpage's UI and `ask` over a remote OpenAI-compatible server (vLLM, SGLang,
llama-server, another chatpage serve): `chatpage.remote.client.RemoteEngineClient`. Needs the
`serve` extra (httpx, prometheus-client); importing this package alone does not.
"""
