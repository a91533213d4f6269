#include "forge/serve/chat_page.h"

namespace forge::serve {

namespace {

// One document; the script is plain ES2017 (fetch, ReadableStream, TextDecoder, async/await).
constexpr const char* kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>forge serve</title>
<style>
  :root { --fg: #1d2330; --muted: #6b7385; --line: #d8dce5; --accent: #2f6fdb; --bg: #f6f7fa; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.45 system-ui, sans-serif; color: var(--fg);
         background: var(--bg); }
  header { display: flex; gap: 1em; align-items: baseline; padding: .7em 1.2em; background: #fff;
           border-bottom: 1px solid var(--line); }
  header h1 { font-size: 1.1em; margin: 0; }
  header .model { color: var(--muted); }
  main { display: grid; grid-template-columns: 1fr 17em; gap: 1em; padding: 1em 1.2em;
         max-width: 70em; }
  .panel { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: .8em; }
  #log { min-height: 14em; max-height: 60vh; overflow-y: auto; }
  .msg { margin: 0 0 .8em; }
  .msg .who { font-size: .8em; color: var(--muted); text-transform: uppercase;
              letter-spacing: .05em; }
  .msg pre, #answer { margin: .2em 0 0; white-space: pre-wrap; word-wrap: break-word;
                      font: inherit; }
  .msg.user pre { color: #38465e; }
  #answer { min-height: 1.4em; }
  textarea { width: 100%; min-height: 5em; font: inherit; padding: .5em;
             border: 1px solid var(--line); border-radius: 6px; resize: vertical; }
  .row { display: flex; gap: .5em; margin-top: .6em; align-items: center; flex-wrap: wrap; }
  button { font: inherit; padding: .35em 1em; border-radius: 6px; border: 1px solid var(--accent);
           background: var(--accent); color: #fff; cursor: pointer; }
  button.plain { background: #fff; color: var(--accent); }
  button:disabled { opacity: .45; cursor: default; }
  label { display: block; font-size: .85em; color: var(--muted); margin-top: .55em; }
  label input, label select { display: block; width: 100%; font: inherit; padding: .25em .4em;
                              border: 1px solid var(--line); border-radius: 5px; color: var(--fg); }
  #stats { color: var(--muted); font-size: .9em; min-height: 1.3em; }
  #error { color: #b3261e; white-space: pre-wrap; }
  @media (max-width: 700px) { main { grid-template-columns: 1fr; } }
</style>
</head>
<body data-state="idle">
<header><h1>forge serve</h1><span class="model" id="model"></span></header>
<main>
  <section>
    <div class="panel" id="log" aria-live="polite"></div>
    <div class="panel" style="margin-top: .8em">
      <textarea id="input" placeholder="Message (Ctrl+Enter sends)"></textarea>
      <div class="row">
        <button id="send">Send</button>
        <button id="stop" class="plain" disabled>Stop</button>
        <button id="clear" class="plain">Clear</button>
        <span id="stats"></span>
      </div>
      <div id="error"></div>
    </div>
  </section>
  <aside class="panel">
    <label>Mode
      <select id="mode">
        <option value="chat">chat (/v1/chat/completions)</option>
        <option value="prompt">prompt (/v1/completions)</option>
      </select>
    </label>
    <label>temperature <input id="temperature" type="number" min="0" step="0.1" value="0.8"></label>
    <label>top_p <input id="top_p" type="number" min="0" max="1" step="0.05" value="1"></label>
    <label>max_tokens <input id="max_tokens" type="number" min="1" step="1" value="128"></label>
    <label>seed (empty: random)
      <input id="seed" type="number" step="1" placeholder="random"></label>
    <label>API key (if the server has one)
      <input id="key" type="password" autocomplete="off"></label>
  </aside>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const conversation = [];  // the chat so far: {role, content}
let controller = null;

function setState(s) { document.body.dataset.state = s; }

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = role;
  const pre = document.createElement("pre");
  pre.textContent = text;
  div.append(who, pre);
  $("log").append(div);
  $("log").scrollTop = $("log").scrollHeight;
  return pre;
}

function numberField(id, integer) {
  const v = $(id).value.trim();
  if (v === "") return undefined;
  const n = Number(v);
  if (!Number.isFinite(n)) throw new Error(id + ": not a number");
  return integer ? Math.trunc(n) : n;
}

// Parses server-sent events from the response body; calls onData with each data payload.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:"))
                        .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data !== "" && onData(data) === false) return;
    }
  }
}

async function send() {
  if (controller) return;
  const mode = $("mode").value;
  const text = $("input").value;
  if (text === "") return;
  $("error").textContent = "";
  $("stats").textContent = "";
  let body;
  try {
    body = { stream: true, stream_options: { include_usage: true } };
    const fields = [["temperature", false], ["top_p", false], ["max_tokens", true], ["seed", true]];
    for (const [k, integer] of fields) {
      const v = numberField(k, integer);
      if (v !== undefined) body[k] = v;
    }
  } catch (e) { $("error").textContent = e.message; setState("error"); return; }
  let path;
  if (mode === "chat") {
    conversation.push({ role: "user", content: text });
    addMessage("user", text);
    body.messages = conversation.slice();
    path = "/v1/chat/completions";
  } else {
    addMessage("prompt", text);
    body.prompt = text;
    path = "/v1/completions";
  }
  $("input").value = "";
  const out = addMessage(mode === "chat" ? "assistant" : "completion", "");
  const answer = $("answer");
  if (answer) answer.removeAttribute("id");
  out.id = "answer";
  out.dataset.chunks = "0";
  const headers = { "Content-Type": "application/json" };
  const key = $("key").value.trim();
  if (key !== "") headers["Authorization"] = "Bearer " + key;
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  setState("running");
  const t0 = performance.now();
  let tFirst = null, tLast = null, chunks = 0, usage = null, finish = null, textSoFar = "";
  let state = "done";
  try {
    const r = await fetch(path, { method: "POST", headers, body: JSON.stringify(body),
                                  signal: controller.signal });
    if (!r.ok) {
      let msg = "HTTP " + r.status;
      try { msg += ": " + (await r.json()).error.message; } catch (_) {}
      throw new Error(msg);
    }
    await readEvents(r, (data) => {
      if (data === "[DONE]") return false;
      const j = JSON.parse(data);
      if (j.error) throw new Error(j.error.message || "server error");
      if (j.usage) usage = j.usage;
      const c = (j.choices || [])[0];
      if (!c) return true;
      const piece = mode === "chat" ? ((c.delta || {}).content || "") : (c.text || "");
      if (c.finish_reason) finish = c.finish_reason;
      if (piece !== "") {
        tLast = performance.now();
        if (tFirst === null) tFirst = tLast;
        textSoFar += piece;
        out.textContent = textSoFar;
        out.dataset.chunks = String(++chunks);
        $("log").scrollTop = $("log").scrollHeight;
      }
      return true;
    });
  } catch (e) {
    if (e.name === "AbortError") state = "stopped";
    else { state = "error"; $("error").textContent = e.message; }
  }
  const tEnd = performance.now();
  if (mode === "chat" && textSoFar !== "")
    conversation.push({ role: "assistant", content: textSoFar });
  const tokens = usage ? usage.completion_tokens : chunks;
  const secs = (tEnd - t0) / 1000;
  if (tokens > 0 && secs > 0) {
    $("stats").textContent = tokens + (usage ? " tokens" : " chunks") + " in " +
      secs.toFixed(2) + " s, " +
      (tokens / secs).toFixed(1) + (usage ? " tokens/s" : " chunks/s") +
      (tFirst !== null ? ", first text after " + ((tFirst - t0)).toFixed(0) + " ms" : "") +
      (finish ? ", finish: " + finish : "") + (state === "stopped" ? " (stopped)" : "");
  }
  controller = null;
  $("send").disabled = false;
  $("stop").disabled = true;
  setState(state);
}

$("send").onclick = send;
$("stop").onclick = () => { if (controller) controller.abort(); };
$("clear").onclick = () => {
  conversation.length = 0;
  $("log").textContent = "";
  $("stats").textContent = "";
};
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) send();
});

// URL parameters prefill the form; autorun=1 submits on load.
const params = new URLSearchParams(location.search);
const urlMode = params.get("mode");
if (urlMode === "prompt" || urlMode === "chat") $("mode").value = urlMode;
for (const k of ["temperature", "top_p", "max_tokens", "seed"])
  if (params.has(k)) $(k).value = params.get(k);
if (params.has("prompt")) $("input").value = params.get("prompt");

fetch("/v1/models").then((r) => (r.ok ? r.json() : null))
  .then((j) => { if (j && j.data && j.data[0]) $("model").textContent = "model: " + j.data[0].id; })
  .catch(() => {});
if (params.get("autorun") === "1") send();
</script>
</body>
</html>
)HTML";

}  // namespace

const std::string& chat_page_html() {
  static const std::string page = kPage;
  return page;
}

}  // namespace forge::serve
