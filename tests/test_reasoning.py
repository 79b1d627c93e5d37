"""A thinking model's <think> block (or gpt-oss's harmony analysis channel) returned as `reasoning_content`: the
split itself (whole and streamed in any cut), the server's chat replies read by the openai client, whole and
streamed, and `specdec generate`'s printing of it."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest

from specdec.api.reasoning import HARMONY, Reasoning, ReasoningStream, reasoning_for, split_reasoning
from specdec.cli import main
from specdec.cli_reasoning import DIM, RESET, AnswerPrinter
from test_server import MESSAGES, RunningServer
from tiny_models import make_tokenizer, save_tiny_model

CLOSED, OPEN_IN_PROMPT = Reasoning(), Reasoning(starts_open=True)


@pytest.mark.parametrize("text,reasoning,expected", [
    ("<think>\nLet me see.\n</think>\n\nThe answer.", CLOSED, ("Let me see.", "The answer.")),
    ("  <think> a  b </think>  c d ", CLOSED, ("a  b", "c d ")),
    ("no block here", CLOSED, (None, "no block here")),
    ("x <think>y</think>", CLOSED, (None, "x <think>y</think>")),  # a block only opens the answer
    ("<think>never closed", CLOSED, ("never closed", "")),
    ("<thin", CLOSED, (None, "<thin")),
    ("still thinking</think>answer", OPEN_IN_PROMPT, ("still thinking", "answer")),
    ("", OPEN_IN_PROMPT, ("", "")),
    # gpt-oss's harmony: the analysis message, then the final channel's marker opens the answer
    ("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Yes.", HARMONY,
     ("Think.", "Yes.")),
    ("<|channel|>final<|message|>Only the answer.", HARMONY, (None, "Only the answer.")),
    ("<|channel|>analysis<|message|>cut off", HARMONY, ("cut off", "")),
    ("<|channel|>commentary<|message|>{}", HARMONY, (None, "<|channel|>commentary<|message|>{}")),  # a tool call
])
def test_split_whole_and_streamed_in_every_cut(text, reasoning, expected):
    assert split_reasoning(text, reasoning) == expected
    for first in range(len(text) + 1):
        for second in range(first, len(text) + 1):
            stream = ReasoningStream(reasoning)
            parts = [stream.feed(text[:first]), stream.feed(text[first:second]), stream.feed(text[second:]),
                     stream.finish()]
            assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == (expected[0] or "", expected[1])


class Template:
    def __init__(self, template: str, rendered: str):
        self.chat_template, self.rendered = template, rendered

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return self.rendered


def test_the_format_follows_the_chat_template():
    qwen3 = Template("...{{ '<think>' }}...", "<|im_start|>assistant\n")
    r1 = Template("...<think>...", "<｜Assistant｜><think>\n")
    plain = Template("{{ messages }}", "assistant:")
    assert reasoning_for(qwen3, "auto") == Reasoning(starts_open=False)
    assert reasoning_for(r1, "auto") == Reasoning(starts_open=True)
    assert reasoning_for(plain, "auto") is None and reasoning_for(qwen3, "none") is None
    assert reasoning_for(plain, "deepseek") == Reasoning(starts_open=False)
    assert reasoning_for(Template(HARMONY_TEMPLATE, "<|start|>assistant"), "auto") == HARMONY


HARMONY_MARKERS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>"]
HARMONY_TEMPLATE = ("{% for m in messages %}<|start|>{{ m['role'] }}{% if m['role'] == 'assistant' %}<|channel|>final"
                    "{% endif %}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
                    "{% if add_generation_prompt %}<|start|>assistant{% endif %}")
# what gpt-oss writes: an analysis message, then the final answer, its markers special tokens
HARMONY_GRAMMAR = ('start: <|channel|> "analysis" <|message|> /[a-z]{1,12}/ <|end|> <|start|> "assistant" '
                   '<|channel|> "final" <|message|> /[a-z]{1,12}/ <|return|>')


def test_a_gpt_oss_answer_keeps_its_channel_markers_and_splits(tmp_path, capsys):
    """A tiny gpt-oss model with a harmony tokenizer (its markers special tokens): the decoded text keeps the
    markers, streamed as whole; `specdec generate --json` splits the analysis channel into reasoning_content
    and --show-reasoning prints it before the answer."""
    from specdec.api.generator import SpeculativeGenerator
    from specdec.api.structured import GrammarSpec

    tokenizer = make_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                                                *HARMONY_MARKERS]})
    tokenizer.chat_template = HARMONY_TEMPLATE
    model = save_tiny_model(tmp_path / "oss", "gpt_oss", tokenizer=tokenizer, vocab_size=len(tokenizer),
                            eos_token_id=tokenizer.convert_tokens_to_ids("<|return|>"))
    generator = SpeculativeGenerator.from_pretrained(str(model), drafter="ngram", k=4)
    settings = dict(grammar=GrammarSpec("lark", HARMONY_GRAMMAR), temperature=0.9, seed=3)
    whole = generator.generate("hi", 60, **settings)
    assert whole.text.startswith("<|channel|>analysis<|message|>") and "<|end|><|start|>assistant" in whole.text
    assert "".join(chunk.text for chunk in generator.stream("hi", 60, **settings)) == whole.text
    thought, answer = split_reasoning(whole.text, HARMONY)
    grammar = tmp_path / "harmony.lark"
    grammar.write_text(HARMONY_GRAMMAR)
    args = ["generate", "hi", "--target", str(model), "--drafter", "ngram", "--grammar", str(grammar),
            "--temperature", "0.9", "--seed", "3", "--max-new-tokens", "60"]
    assert main([*args, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["reasoning_content"], printed["content"]) == (thought, answer) and thought.isalpha()
    assert main([*args, "--show-reasoning"]) == 0
    assert capsys.readouterr().out.strip() == f"<think>\n{thought}\n</think>\n\n{answer}"


THINKING = 'root ::= "<think>" [a-z]{1,12} "</think>" [a-z]{1,12}'  # the tiny model writes what a thinker would


def test_served_reasoning_content_whole_and_streamed(tiny_generator):
    server = RunningServer(tiny_generator, reasoning_format="deepseek")
    try:
        settings = dict(model="tiny", messages=MESSAGES, max_tokens=60, temperature=0.9, seed=5,
                        extra_body={"grammar": THINKING})
        whole = server.client.chat.completions.create(**settings).choices[0].message
        assert whole.reasoning_content and whole.content and "<think>" not in whole.content + whole.reasoning_content
        thought, answer = [], []
        for chunk in server.client.chat.completions.create(**settings, stream=True):
            if chunk.choices:
                delta = chunk.choices[0].delta
                thought.append(getattr(delta, "reasoning_content", None) or "")
                answer.append(delta.content or "")
        assert ("".join(thought), "".join(answer)) == (whole.reasoning_content, whole.content)
        # an answer without a block has no reasoning_content
        plain = server.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8).choices[0]
        assert getattr(plain.message, "reasoning_content", None) is None and plain.message.content
    finally:
        server.stop()


def test_generate_prints_the_answer_and_the_reasoning_on_request(tiny_dirs, tmp_path, capsys):
    """`specdec generate` on a thinking answer: the answer alone by default (and a note), the block in its tags
    before it with --show-reasoning when piped; --json splits it as the server does."""
    grammar = tmp_path / "think.gbnf"
    grammar.write_text(THINKING)
    args = ["generate", "hello", "--target", str(tiny_dirs["llama"]), "--drafter", "ngram", "--grammar", str(grammar),
            "--reasoning-format", "deepseek", "--temperature", "0.9", "--seed", "5", "--max-new-tokens", "60"]
    assert main([*args, "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["reasoning_content"] and whole["content"] and "<think>" not in whole["content"]
    assert main(args) == 0
    printed = capsys.readouterr()
    assert printed.out.strip() == whole["content"].strip() and "--show-reasoning" in printed.err
    assert main([*args, "--show-reasoning"]) == 0
    assert capsys.readouterr().out.strip() == f"<think>\n{whole['reasoning_content']}\n</think>\n\n{whole['content']}"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("show", [True, False])
def test_a_terminal_sees_the_reasoning_dimmed_or_nothing_of_it(show):
    out = Terminal()
    printer = AnswerPrinter(CLOSED, show_reasoning=show, out=out)
    for text in ["<thi", "nk>mull", "ing</th", "ink>\n\nYes", "."]:
        printer(SimpleNamespace(text=text))
    printer.finish()
    assert out.getvalue() == (f"{DIM}mulling{RESET}\n\nYes." if show else "Yes.")
    assert printer.omitted == (not show)
