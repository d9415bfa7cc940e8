"""The client side of `ottvid ask / ground --server URL`: a question about a video sent to a running server
instead of a local model (the server side, `ottvid serve`, is `ottvid_cli.serve`).

client.py the HTTP client (httpx) and what `ottvid serve` is sent and answers; openai_compat.py what a plain
OpenAI-compatible server (vLLM's `vllm serve`) is sent and how its reply is read as a local run's. Importing
this package imports nothing heavy (httpx only when a `Client` is made); nothing here prints.
"""
