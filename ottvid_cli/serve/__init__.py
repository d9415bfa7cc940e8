"""`ottvid serve`: an OpenAI-compatible HTTP API over one loaded model (docs/serve.md).

app.py the FastAPI app, schema.py the request and response bodies, worker.py the queue and the model
thread, security.py the API key and which videos may be read, page.py the browser page; the command is
`ottvid_cli/cli/serve.py`, and the client behind `ask --server` is `ottvid_cli.remote`. Importing this
package imports nothing heavy: FastAPI and uvicorn are the optional extra `ottvid-cli[serve]`.
"""
