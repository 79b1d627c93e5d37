"""Ollama's own API (`/api/chat`, `/api/generate` with NDJSON streams, `/api/tags`, `/api/show`, `/api/ps`, ...),
so the tools built on Ollama reach specdec with only a host change. One dialect of the server: its bodies are read
into the chat request every API runs (bodies.py), its replies written from the one event stream (reply.py), its
model routes from what the server serves (catalog.py); routes.py holds the routes.
"""
