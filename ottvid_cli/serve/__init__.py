"""`ottvid serve`: an OpenAI-compatible HTTP API over one loaded model (docs/serve.md).

app.py the FastAPI app, schema.py the request and response bodies, worker.py the queue and the model
thread, security.py the API key and which videos may be read, client.py `ask --server`, command.py
the command's body. Importing this package imports nothing heavy: FastAPI and uvicorn are the
optional extra `ottvid-cli[serve]`.
"""
