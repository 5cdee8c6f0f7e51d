"""`tracengine serve`: an OpenAI-compatible HTTP server on the engine, recording the traffic it serves.

protocol.py  request bodies (typed msgspec structs), validation, OpenAI-shaped responses and errors
engine_loop.py  the one thread that steps the engine; requests and aborts enter it between steps
app.py       the Starlette application: routes, API key, SSE streaming, disconnects
metrics.py   Prometheus metrics under vLLM's names
server.py    uvicorn, signals, a clean end of the trace
bench.py     `tracengine bench-serve`: the load client
docs/serve.md says what each endpoint accepts."""
