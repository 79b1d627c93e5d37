"""The `specdec` command's verbs, one module each. A verb module has `add_parser(commands)` (its options), a
frozen options class built from the parsed arguments that checks itself at construction (`from_args`: a bad
value is one line before anything loads), and `run(options) -> int`; `specdec/cli.py` builds the parser
from them and dispatches.

Imports: a verb module imports at its top what parsing and checking need. What only running needs (the
server's web stack, the benchmark's and training's modules, transformers, the optional ray and peft) is
imported inside `run` and `from_args`: the parser imports every verb module, and a mistyped option must be
answered in a second or two, not after every command's dependencies have loaded.

The rest of the package imports at module level, but for these, each imported inside the function that
needs it: transformers (about two seconds to import; only where a transformers object is built:
models/hf_adapter.py, models/sources/loading.py, tokenizer_files.py and gguf_convert.py, bench/peers.py,
training/distill.py); llguidance (api/structured.py: requests and options are checked on the CLI's fast path,
a grammar is compiled only when one is asked for); peft (several seconds: it imports transformers and more;
only a LoRA merge needs it: models/adapters.py, training/distill.py); pydivsufsort (only building a retrieval
datastore needs it: heads/datastore.py); the optional ray (server/ray_app.py); `resource` (POSIX only,
bench/runner.py); cli_options.py, which the verbs' parsers share, and what the option checks they run would
otherwise pull in (drafters/draft_options.py's model modules, models/sources/zoo.py's GGUF conversion,
api/structured.py's jsonschema); certify/command.py is a verb module too.
"""
