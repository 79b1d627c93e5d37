"""The `specdec` command's verbs, one module each. A verb module has `add_parser(commands)` (its options), a
frozen options class built from the parsed arguments that checks itself at construction (`from_args`: a bad
value is one line before anything loads), and `run(options) -> int`; `specdec/cli.py` builds the parser
from them and dispatches.

Imports: a verb module imports at its top what parsing and checking need. What only running needs (the
server's web stack, the benchmark's and training's modules, transformers, the optional ray and peft) is
imported inside `run` and `from_args`: the parser imports every verb module, and a mistyped option must be
answered in a second or two, not after every command's dependencies have loaded.
"""
