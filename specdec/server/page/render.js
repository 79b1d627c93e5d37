// How an answer's text is drawn: Markdown (sanitized, code highlighted) whose text keeps each token's origin
// colour, in and out of code blocks; or, as an option, the raw tokens in monospace.
"use strict";

const specdecRender = (() => {
  const LOOKUP_SOURCES = ["ngram", "retrieval", "lookup", "suffix", "lookahead"];

  function describe(answer, token) {
    const round = answer.rounds[token.round];
    return `round ${token.round + 1}: ${token.origin}${round.source ? ` (${round.source})` : ""}; K ${round.k}, ` +
           `drafted ${round.drafted}, accepted ${round.accepted}; draft ${round.draftMs.toFixed(1)} ms, ` +
           `verify ${round.verifyMs.toFixed(1)} ms`;
  }

  // One token's text (or the part of it in one rendered text run) in its origin's colour.
  function tokenSpan(answer, index, text) {
    const token = answer.tokens[index];
    const round = answer.rounds[token.round];
    const span = document.createElement("span");
    span.className = "tok";
    span.dataset.origin = token.origin;
    span.dataset.token = index;
    if (token.origin === "drafted" && round.source) {
      span.dataset.source = round.source;
      span.dataset.kind = LOOKUP_SOURCES.some(name => round.source.startsWith(name)) ? "lookup" : "model";
    }
    span.title = describe(answer, token);
    span.textContent = text;
    return span;
  }

  function rawTokens(answer) {
    const view = document.createElement("div");
    view.className = "tokens";
    answer.tokens.forEach((token, index) => view.append(tokenSpan(answer, index, token.text)));
    return view;
  }

  function markdown(text) {
    const view = document.createElement("div");
    view.className = "markdown";
    view.innerHTML = DOMPurify.sanitize(marked.parse(text));
    view.querySelectorAll("pre code").forEach(block => hljs.highlightElement(block));
    view.querySelectorAll("pre").forEach(pre => pre.prepend(copyButton(() => pre.querySelector("code").textContent,
                                                                         "copy this code")));
    return view;
  }

  // Markdown of the tokens' text, each rendered text run split at its tokens' boundaries: the runs are found,
  // in order, in the text the tokens spell (a run Markdown rewrote, e.g. an entity, is left uncoloured).
  function colouredMarkdown(answer) {
    const text = answer.tokens.map(token => token.text).join("");
    const view = markdown(text);
    const ends = [];
    answer.tokens.reduce((at, token) => { ends.push(at + token.text.length); return at + token.text.length; }, 0);
    const walker = document.createTreeWalker(view, NodeFilter.SHOW_TEXT, {
      acceptNode: node => node.parentElement.closest(".copy") ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
    const runs = [];
    while (walker.nextNode()) runs.push(walker.currentNode);
    let cursor = 0, index = 0;
    for (const run of runs) {
      const value = run.nodeValue;
      const found = value.trim() ? text.indexOf(value, cursor) : -1;
      if (found < 0) continue;
      while (index < ends.length && ends[index] <= found) index++;
      const parts = document.createDocumentFragment();
      for (let at = found; at < found + value.length; index++) {
        const end = Math.min(ends[index], found + value.length);
        parts.append(tokenSpan(answer, index, text.slice(at, end)));
        at = end;
        if (end < ends[index]) break;  // the token goes on in the next run
      }
      run.replaceWith(parts);
      cursor = found + value.length;
    }
    return view;
  }

  function copyButton(text, label) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "copy";
    button.textContent = "Copy";
    button.setAttribute("aria-label", label);
    button.onclick = async () => {
      try {
        await navigator.clipboard.writeText(text());
        button.textContent = "Copied";
      } catch (error) {
        button.textContent = "Copy failed";  // a page served over plain http to another host has no clipboard
      }
      setTimeout(() => { button.textContent = "Copy"; }, 1500);
    };
    return button;
  }

  return {tokenSpan, rawTokens, markdown, colouredMarkdown, copyButton, describe};
})();
