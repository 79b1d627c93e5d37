// The chat page of `specdec serve`: conversations kept in this browser, answers streamed from the server's
// OpenAI chat route with the `include_speculation` extension, so that every token shows how it was made,
// and Compare decodes the same conversation again without speculation to show both speeds and that the
// outputs are identical.
"use strict";

const STORE = "specdec.conversations";
const SETTINGS = "specdec.settings";
const $ = id => document.getElementById(id);

let conversations = JSON.parse(localStorage.getItem(STORE) || "[]");
// an answer still streaming when the page was closed ended then
conversations.forEach(c => c.messages.forEach(m => { if (m.pending) { m.pending = false; m.stopped = true; } }));
let current = conversations[0] || null;
let settings = {systemPrompt: "", temperature: 0, maxTokens: 512, topP: "", topK: "", seed: "", stop: "", apiKey: "",
                model: "", rawTokens: false, ...JSON.parse(localStorage.getItem(SETTINGS) || "{}")};
let running = null;  // the AbortController of the answer being streamed

function save() {
  localStorage.setItem(STORE, JSON.stringify(conversations));
  localStorage.setItem(SETTINGS, JSON.stringify(settings));
}

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = !text;
}

// -- the API ------------------------------------------------------------------------------------------
function headers() {
  const result = {"Content-Type": "application/json"};
  if (settings.apiKey) result.Authorization = `Bearer ${settings.apiKey}`;
  return result;
}

async function getJSON(path) {
  const response = await fetch(path, {headers: headers()});
  if (response.status === 401) throw keyRefused();
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

// A 401: the key box, saying whether a key is missing or the one given is wrong.
function keyRefused() {
  $("key-needed").hidden = false;
  const message = settings.apiKey ? "wrong key: the server refused the API key given" : "the server needs an API key";
  $("key-status").textContent = message;
  return new Error(message);
}

// POST a streamed chat request; onChunk(chunk) for each server-sent event's JSON.
async function streamChat(body, onChunk, signal) {
  const response = await fetch("/v1/chat/completions", {method: "POST", headers: headers(), signal,
                                                          body: JSON.stringify({...body, stream: true})});
  if (response.status === 401) throw keyRefused();
  if (!response.ok) {
    const error = await response.json().catch(() => ({}));
    throw new Error(error.error ? error.error.message : `HTTP ${response.status}`);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter(line => line.startsWith("data: ")).map(line => line.slice(6)).join("");
      if (!data || data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      onChunk(chunk);
    }
  }
}

// The request for the conversation's messages before `upTo`: a failed or empty answer is not a turn.
function requestFor(conversation, upTo) {
  const messages = conversation.messages.slice(0, upTo)
    .filter(m => m.role === "user" || (m.content && !m.failed)).map(m => ({role: m.role, content: m.content}));
  if (settings.systemPrompt) messages.unshift({role: "system", content: settings.systemPrompt});
  const request = {messages, temperature: Number(settings.temperature), max_tokens: Number(settings.maxTokens),
                   stream_options: {include_usage: true, include_speculation: true}};
  if (settings.model) request.model = settings.model;
  if (settings.topP !== "") request.top_p = Number(settings.topP);
  if (settings.topK !== "") request.top_k = Number(settings.topK);
  const stop = settings.stop.split("\n").filter(Boolean);
  if (stop.length) request.stop = stop;
  return request;
}

// -- answering ----------------------------------------------------------------------------------------
async function ask(text) {
  if (!current) newConversation();
  current.messages.push({role: "user", content: text});
  if (current.title === "New conversation") current.title = text.slice(0, 40);
  await answerLast(current);
}

// A new answer to the conversation's last message (a new turn, or a regenerated answer).
async function answerLast(conversation) {
  const seed = settings.seed !== "" ? Number(settings.seed) : Math.floor(Math.random() * 2 ** 31);
  const answer = {role: "assistant", content: "", tokens: [], rounds: [], seed, pending: true};
  conversation.messages.push(answer);
  save();
  renderConversations();
  renderMessages();
  await streamAnswer(conversation, answer, conversation.messages.length - 1);
}

async function streamAnswer(conversation, answer, index) {
  running = new AbortController();
  setRunning(true);
  const started = performance.now();
  // the exact request, kept with the answer: Compare replays it, whatever the settings are by then
  answer.request = {...requestFor(conversation, index), seed: answer.seed};
  const shown = () => conversation === current;  // the user may switch conversation while it streams
  try {
    await streamChat(answer.request, chunk => {
      readChunk(answer, chunk);
      if (answer.content && answer.firstTokenMs === undefined) answer.firstTokenMs = performance.now() - started;
      if (shown()) renderAnswer(answer, index, true);
    }, running.signal);
  } catch (error) {
    if (error.name !== "AbortError") { showError(error.message); answer.failed = error.message; }
    else answer.stopped = true;
  } finally {
    answer.pending = false;
    answer.seconds = (performance.now() - started) / 1000;
    running = null;
    setRunning(false);
    save();
    if (shown()) renderAnswer(answer, index, false);
  }
}

function readChunk(answer, chunk) {
  for (const choice of chunk.choices || []) {
    answer.content += choice.delta.content || "";
    answer.reasoning = (answer.reasoning || "") + (choice.delta.reasoning_content || "");
    if (choice.finish_reason) answer.finishReason = choice.finish_reason;
  }
  if (chunk.speculation) {
    const round = chunk.speculation;
    answer.rounds.push({source: round.source, k: round.k, drafted: round.drafted, accepted: round.accepted,
                        draftMs: round.draft_ms, verifyMs: round.verify_ms});
    for (const token of round.tokens) {
      answer.tokens.push({text: token.text, origin: token.origin, round: answer.rounds.length - 1});
    }
  }
  if (chunk.specdec) answer.stats = chunk.specdec;
  if (chunk.speculation_fit !== undefined) answer.fit = chunk.speculation_fit;
  if (chunk.usage) answer.usage = chunk.usage;
}

function setRunning(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
}

// Compare: the answer's own request (its messages, sampling, seed and length, kept when it was made) again
// without speculation; identical output is what exactness promises (greedy, or sampling with the same seed).
// It can be cancelled, and Send waits while it runs.
async function compare(answer, index) {
  const conversation = current;
  const plain = {content: "", tokens: [], rounds: []};
  const body = {...(answer.request || {...requestFor(conversation, index), seed: answer.seed}),
                speculative: {enabled: false}};
  answer.comparison = {state: "running"};
  running = new AbortController();
  setRunning(true);
  renderAnswer(answer, index, false);
  try {
    await streamChat(body, chunk => readChunk(plain, chunk), running.signal);
    answer.comparison = {state: plain.content === answer.content ? "identical" : "different",
                         plainTokensPerSecond: plain.stats ? plain.stats.tokens_per_second : null};
  } catch (error) {
    answer.comparison = error.name === "AbortError" ? {state: "cancelled"} : {state: "failed", error: error.message};
  } finally {
    running = null;
    setRunning(false);
  }
  save();
  if (conversation === current) renderAnswer(answer, index, false);
}

// Why an answer cannot be compared (null: it can): only a whole answer says what decoding wrote.
function notComparable(answer) {
  if (answer.stopped) return "stopped before its end: a plain run would go on";
  if (answer.failed) return "failed: nothing to compare";
  if (!answer.content) return "empty: nothing to compare";
  return null;
}

// -- rendering ----------------------------------------------------------------------------------------
function renderConversations() {
  const list = $("conversations");
  list.replaceChildren(...conversations.map(conversation => {
    const item = document.createElement("li");
    item.className = conversation === current ? "current" : "";
    const title = document.createElement("span");
    title.textContent = conversation.title;
    title.tabIndex = 0;  // reachable by keyboard: Enter or Space opens it
    title.setAttribute("role", "button");
    const open = () => { current = conversation; $("sidebar").classList.remove("open"); renderConversations(); renderMessages(); };
    title.onclick = open;
    title.onkeydown = event => { if (event.key === "Enter" || event.key === " ") { event.preventDefault(); open(); } };
    const remove = document.createElement("button");
    remove.textContent = "×";
    remove.title = "delete this conversation";
    remove.setAttribute("aria-label", `delete the conversation "${conversation.title}"`);
    remove.className = "delete-conversation";
    remove.onclick = () => deleteConversation(conversation);
    item.append(title, remove);
    return item;
  }));
}

function renderMessages() {
  $("messages").replaceChildren();
  (current ? current.messages : []).forEach((message, index) => {
    if (message.role === "user") {
      const element = document.createElement("div");
      element.className = "message user";
      element.dataset.index = index;
      const text = document.createElement("div");
      text.textContent = message.content;
      element.append(text, userActions(message, index));
      $("messages").append(element);
    } else {
      renderAnswer(message, index, false);
    }
  });
}

function answerElement(index) {
  let element = document.querySelector(`.message.assistant[data-index="${index}"]`);
  if (!element) {
    element = document.createElement("div");
    element.className = "message assistant";
    element.dataset.index = index;
    $("messages").append(element);
  }
  return element;
}

function renderAnswer(answer, index, streaming) {
  const element = answerElement(index);
  streaming = streaming || Boolean(answer.pending);
  element.dataset.state = streaming ? "streaming" : (answer.stopped ? "stopped" : "done");
  if (answer.firstTokenMs !== undefined) element.dataset.firstTokenMs = answer.firstTokenMs.toFixed(1);
  const messages = $("messages");
  const following = messages.scrollHeight - messages.scrollTop - messages.clientHeight < 40;  // the user is at the bottom
  const body = document.createElement("div");
  body.className = "body";
  const coloured = $("show-speculation").checked && answer.tokens.length;
  if (coloured && settings.rawTokens) body.append(specdecRender.rawTokens(answer));
  else if (coloured) body.append(specdecRender.colouredMarkdown(answer));
  else body.append(specdecRender.markdown(answer.content));
  body.onclick = event => showTokenDetail(answer, element, event.target);
  const parts = [...(answer.reasoning ? [reasoningView(answer.reasoning)] : []), body, statsView(answer)];
  element.replaceChildren(...parts, ...(streaming ? [] : [actionsView(answer, index)]));
  if (!streaming && $("show-speculation").checked && answer.fit) element.append(chartsView(answer));
  if (following) messages.scrollTop = messages.scrollHeight;
}

// A token's round, on click or tap (hover shows it too): touch screens and keyboards have no hover.
function showTokenDetail(answer, element, target) {
  const span = target.closest ? target.closest(".tok[data-token]") : null;
  if (!span) return;
  let detail = element.querySelector(".token-detail");
  if (!detail) {
    detail = document.createElement("div");
    detail.className = "token-detail";
    detail.setAttribute("role", "status");
    element.querySelector(".body").after(detail);
  }
  const token = answer.tokens[Number(span.dataset.token)];
  detail.textContent = `${JSON.stringify(token.text)}: ${specdecRender.describe(answer, token)}`;
}

function reasoningView(text) {
  const view = document.createElement("details");
  view.className = "reasoning";
  const summary = document.createElement("summary");
  summary.textContent = "Reasoning";
  const body = document.createElement("div");
  body.textContent = text;
  view.append(summary, body);
  return view;
}

function statsView(answer) {
  const view = document.createElement("div");
  view.className = "stats";
  const s = answer.stats;
  if (s) {
    view.innerHTML = `<span class="tokens-per-second">${s.tokens_per_second.toFixed(1)} tok/s</span>` +
      `<span class="tau">tau ${s.tau.toFixed(2)}</span>` +
      `<span class="acceptance">acceptance ${(100 * s.acceptance_rate).toFixed(0)}%</span>` +
      `<span>${s.rounds} rounds, drafter ${s.drafter}</span>`;
  }
  if (answer.firstTokenMs !== undefined) {
    const first = document.createElement("span");
    first.textContent = `first token ${answer.firstTokenMs.toFixed(0)} ms`;
    view.append(first);
  }
  const ended = answer.failed ? `failed: ${answer.failed}` : answer.stopped ? "stopped" :
    answer.finishReason === "length" ? "cut at the token limit" : (!answer.pending && !answer.content ? "empty" : "");
  if (ended) {
    const mark = document.createElement("span");
    mark.className = "ended";
    mark.textContent = ended;
    view.append(mark);
  }
  return view;
}

function actionsView(answer, index) {
  const view = document.createElement("div");
  view.className = "actions";
  const button = document.createElement("button");
  button.type = "button";
  button.className = "compare-button";
  button.textContent = "Compare with plain decoding";
  const reason = notComparable(answer);
  button.disabled = Boolean(reason) || Boolean(running);
  button.title = reason || "decode this answer's own request again without speculation";
  button.onclick = () => compare(answer, index);
  view.append(specdecRender.copyButton(() => answer.content, "copy this answer"), button);
  if (index === current.messages.length - 1) view.append(actionButton("Regenerate", "answer the last message again",
                                                                       () => regenerate(current)));
  view.append(actionButton("Delete", "delete this answer", () => deleteMessage(current, index)));
  if (reason) {
    const why = document.createElement("span");
    why.className = "compare unavailable";
    why.textContent = reason;
    view.append(why);
  }
  if (answer.comparison) {
    const result = document.createElement("span");
    const c = answer.comparison;
    result.className = `compare ${c.state}`;
    const plainSpeed = c.plainTokensPerSecond ? c.plainTokensPerSecond.toFixed(1) : "?";
    const speculativeSpeed = answer.stats ? answer.stats.tokens_per_second.toFixed(1) : "?";
    const ratio = c.plainTokensPerSecond && answer.stats ?
      ` (${(answer.stats.tokens_per_second / c.plainTokensPerSecond).toFixed(2)}x)` : "";
    result.textContent = c.state === "running" ? "decoding without speculation… (Stop cancels)" :
      c.state === "failed" ? c.error : c.state === "cancelled" ? "comparison cancelled" :
      `${c.state}; plain ${plainSpeed} tok/s vs speculative ${speculativeSpeed} tok/s${ratio}`;
    view.append(result);
  }
  return view;
}

function actionButton(text, label, onclick) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = text.toLowerCase();
  button.textContent = text;
  button.setAttribute("aria-label", label);
  button.disabled = Boolean(running);
  button.onclick = onclick;
  return button;
}

function userActions(message, index) {
  const view = document.createElement("div");
  view.className = "actions";
  view.append(specdecRender.copyButton(() => message.content, "copy this message"),
              actionButton("Edit", "edit this message and send it again (what follows it goes)", () => edit(current, index)),
              actionButton("Delete", "delete this message", () => deleteMessage(current, index)));
  return view;
}

// -- editing a conversation ---------------------------------------------------------------------------
async function regenerate(conversation) {
  if (running || conversation.messages.at(-1).role !== "assistant") return;
  conversation.messages.pop();
  await answerLast(conversation);
}

// The message's text back in the prompt box; it and what follows it leave the conversation until it is sent.
function edit(conversation, index) {
  if (running) return;
  $("prompt").value = conversation.messages[index].content;
  conversation.messages.splice(index);
  save();
  renderMessages();
  $("prompt").focus();
}

function deleteMessage(conversation, index) {
  if (running) return;
  conversation.messages.splice(index, 1);
  save();
  renderMessages();
}

function exportConversations() {
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob([JSON.stringify(conversations, null, 1)], {type: "application/json"}));
  link.download = "specdec-conversations.json";
  link.click();
  URL.revokeObjectURL(link.href);
}

// Conversations from an exported file, added before the ones here (one with the same id is replaced).
async function importConversations(file) {
  try {
    const imported = JSON.parse(await file.text());
    const valid = Array.isArray(imported) && imported.every(c => c && typeof c.id === "string" &&
      typeof c.title === "string" && Array.isArray(c.messages) &&
      c.messages.every(m => m && ["user", "assistant"].includes(m.role) && typeof m.content === "string"));
    if (!valid) throw new Error("not a file of exported conversations");
    imported.forEach(c => c.messages.forEach(m => { m.tokens = m.tokens || []; m.rounds = m.rounds || []; }));
    const ids = new Set(imported.map(c => c.id));
    conversations = [...imported, ...conversations.filter(c => !ids.has(c.id))];
    current = conversations[0] || null;
    save();
    renderConversations();
    renderMessages();
    showError("");
  } catch (error) {
    showError(`import: ${error.message}`);
  }
}

function chartsView(answer) {
  const view = document.createElement("div");
  view.className = "charts";
  view.append(specdecCharts.acceptanceChart(answer.fit.alphas, answer.fit.samples),
              specdecCharts.speedupChart(answer.fit.speedup_by_k, answer.fit.mean_k, answer.fit.best_k));
  return view;
}

// -- conversations and settings -----------------------------------------------------------------------
function newConversation() {
  current = {id: Date.now().toString(36), title: "New conversation", messages: []};
  conversations.unshift(current);
  save();
  renderConversations();
  renderMessages();
}

function deleteConversation(conversation) {
  conversations = conversations.filter(c => c !== conversation);
  if (current === conversation) current = conversations[0] || null;
  save();
  renderConversations();
  renderMessages();
}

const FIELDS = {systemPrompt: "system-prompt", temperature: "temperature", maxTokens: "max-tokens", topP: "top-p",
                topK: "top-k", seed: "seed", stop: "stop-strings", apiKey: "api-key"};

function loadSettingsForm() {
  $("show-speculation").checked = settings.speculationView !== false;
  $("legend").hidden = !$("show-speculation").checked;
  $("raw-tokens").checked = Boolean(settings.rawTokens);
  for (const [name, id] of Object.entries(FIELDS)) $(id).value = settings[name];
}

function readSettingsForm() {
  const read = {};
  for (const [name, id] of Object.entries(FIELDS)) read[name] = $(id).value;
  read.temperature = Number(read.temperature);
  read.maxTokens = Number(read.maxTokens);
  return {...settings, ...read, rawTokens: $("raw-tokens").checked};
}

async function loadServerInfo() {
  try {
    const models = await getJSON("/v1/models");
    const ids = models.data.map(model => model.id);
    $("model").replaceChildren(...ids.map(id => new Option(id, id)));
    if (!ids.includes(settings.model)) settings.model = ids[0] || "";
    $("model").value = settings.model;
    const props = await getJSON("/props");
    $("drafter").textContent = `drafter: ${props.speculative.drafter}`;
    $("key-needed").hidden = true;
    showError("");
  } catch (error) {
    showError(error.message);
  }
}

function wire() {
  $("composer").onsubmit = event => {
    event.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || running) return;
    $("prompt").value = "";
    showError("");
    ask(text);
  };
  $("prompt").onkeydown = event => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("composer").requestSubmit(); }
  };
  $("stop").onclick = () => running && running.abort();
  document.addEventListener("keydown", event => { if (event.key === "Escape" && running) running.abort(); });
  $("toggle-sidebar").onclick = () => $("sidebar").classList.toggle("open");
  $("key-entry").onkeydown = event => { if (event.key === "Enter") { event.preventDefault(); $("use-key").click(); } };
  $("new-conversation").onclick = newConversation;
  $("open-settings").onclick = () => { $("settings").hidden = !$("settings").hidden; };
  $("show-speculation").onchange = () => {
    settings.speculationView = $("show-speculation").checked;
    save();
    $("legend").hidden = !settings.speculationView;
    renderMessages();
  };
  $("save-settings").onclick = () => {
    settings = readSettingsForm();
    save();
    $("settings").hidden = true;
    renderMessages();
    loadServerInfo();
  };
  $("model").onchange = () => { settings.model = $("model").value; save(); };
  $("export").onclick = exportConversations;
  $("import").onchange = event => { if (event.target.files[0]) importConversations(event.target.files[0]); };
  $("use-key").onclick = () => {
    settings.apiKey = $("key-entry").value;
    save();
    loadSettingsForm();
    loadServerInfo();
  };
}

wire();
loadSettingsForm();
renderConversations();
renderMessages();
loadServerInfo();
