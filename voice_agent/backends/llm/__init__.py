"""LLM clients and the embedded llama-server they can talk to."""
