"""Token ids -> text: special tokens left out, except the markers a chat format's structure is read from.

gpt-oss answers in OpenAI's harmony format, whose channels (analysis: reasoning; final: the answer) are
told apart only by special tokens (`<|channel|>analysis<|message|>...<|end|>`). Decoded without them the
reply reads "analysis...assistantfinal...", which nothing downstream can split; so for a harmony chat
template those markers stay in the text, as llama-server and vLLM read them, and the reasoning split
(api/reasoning.py) takes them out again.
"""

from __future__ import annotations

from typing import Sequence

HARMONY_MARKERS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>")


def is_harmony_template(template: object) -> bool:
    """Whether a chat template writes OpenAI's harmony format (gpt-oss)."""
    return isinstance(template, str) and "<|channel|>" in template and "<|message|>" in template


def kept_markers(tokenizer) -> dict[int, str]:
    """Token id -> text of the special tokens decoded text keeps for this tokenizer (none but harmony's)."""
    if not is_harmony_template(getattr(tokenizer, "chat_template", None)):
        return {}
    unknown = getattr(tokenizer, "unk_token_id", None)
    ids = {marker: tokenizer.convert_tokens_to_ids(marker) for marker in HARMONY_MARKERS}
    return {token: marker for marker, token in ids.items() if isinstance(token, int) and token != unknown}


def decode_text(tokenizer, ids: Sequence[int], markers: dict[int, str]) -> str:
    """The text of `ids` with special tokens skipped, save `markers` (kept_markers), which keep their text."""
    def plain(run: list[int]) -> str:
        return tokenizer.decode(run, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    if not markers or not any(token in markers for token in ids):
        return plain(list(ids))
    parts, run = [], []
    for token in ids:
        if token in markers:  # a special token never splits a character's bytes: runs decode alone
            parts += [plain(run), markers[token]]
            run = []
        else:
            run.append(token)
    return "".join(parts + [plain(run)])
