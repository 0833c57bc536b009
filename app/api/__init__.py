"""The OpenAI-compatible API: request parsing, the FastAPI app and its swarm backend,
serving it with uvicorn. Built on app.client; knows no serving or lab."""
