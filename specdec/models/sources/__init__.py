"""Where models come from: the zoo (pull, verify, convert), GGUF conversion, and loading a model directory or file
into a runtime (native or transformers) in a weight format."""
