"""The OpenAI-compatible server (`specdec serve`)."""
