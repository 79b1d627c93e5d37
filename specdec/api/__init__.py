"""The Python API, the only way in for every front end (CLI, server, bench, certify, training): a request
(request), the generator that loads a target and its drafter and runs requests one at a time or batched
(generator, batch), JSONL batch files (batch_file) and the prompt prefix cache (prefix_cache)."""
