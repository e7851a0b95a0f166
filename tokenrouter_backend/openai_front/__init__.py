"""The OpenAI-compatible front: `/v1/models`, `/v1/completions`, `/v1/chat/completions` over
the ``tokenrouter`` ensemble's gRPC stream (FastAPI + uvicorn; `tokenrouter serve --openai-port`)."""
