// The playground page's wiring: finds the model (asking for a key when the server answers 401),
// sends the conversation with the settings as a streamed chat completion, and runs the metrics
// panel. Served by fathom itself (server/playground.h); no framework, no third-party code.
import { ApiError, getJson, hasApiKey, setApiKey, streamEvents } from "./api.js";
import { Answer, addNotice, addUserTurn, clearLog } from "./chat.js";
import { MetricsPanel } from "./metrics.js";
import { SettingError, asCurl, buildChatRequest, readSchema } from "./request.js";
import { installTokenTips, registerAnswer } from "./tokens.js";

const $ = (id) => document.getElementById(id);

const state = {
  model: "",
  maxN: 16,
  history: [],         // [{role, content}] sent with the next turn
  controller: null,    // AbortController of the request in flight
  lastBody: null,      // the last request sent (shown, and copied as curl)
};

function setStatus(text) { $("status").textContent = text; }

function askForKey(message) {
  $("key-form").hidden = false;
  setStatus(message);
  $("api-key").focus();
}

// GET /v1/models: the served model's id (the request's "model") and context length.
async function connect() {
  try {
    const list = await getJson("/v1/models");
    const m = list.data[0];
    state.model = m.id;
    $("model").textContent = `${m.id}` + (m.max_model_len ? ` (context ${m.max_model_len} tokens)` : "");
    setStatus(hasApiKey() ? "Ready (key accepted)." : "Ready.");
    $("send").disabled = false;
  } catch (e) {
    $("send").disabled = true;
    if (e instanceof ApiError && e.status === 401) {
      $("model").textContent = "unknown until a key is given";
      askForKey(hasApiKey() ? "That API key was refused: check it and try again." : "This server needs an API key: type it above.");
    } else if (e instanceof ApiError && e.status === 503) {
      setStatus("The model is still loading…");
      setTimeout(connect, 2000);
    } else {
      setStatus("Cannot reach the server: " + e.message + " (retrying)");
      setTimeout(connect, 3000);
    }
  }
}

function busy(on) {
  $("send").disabled = on;
  $("cancel").disabled = !on;
  $("log").setAttribute("aria-busy", on ? "true" : "false");
}

async function send() {
  const text = $("prompt").value.trim();
  if (!text || state.controller) return;
  let body;
  try {
    body = buildChatRequest(state.model, [...state.history, { role: "user", content: text }], state.maxN);
  } catch (e) {
    if (!(e instanceof SettingError)) throw e;
    setStatus(e.message);
    $(e.field).focus();
    return;
  }
  state.lastBody = body;
  $("last-request").textContent = JSON.stringify(body, null, 2);
  $("prompt").value = "";
  if (document.querySelector(".intro")) clearLog();
  addUserTurn(text);
  const answer = new Answer(body.n || 1, !!body.logprobs);
  registerAnswer(answer);
  state.controller = new AbortController();
  busy(true);
  setStatus("Generating…");
  let error = "";
  try {
    await streamEvents("/v1/chat/completions", body, (chunk) => answer.add(chunk), state.controller.signal);
  } catch (e) {
    if (e.name === "AbortError") error = "stopped";
    else {
      error = e.message;
      addNotice(e.message, "error");
      if (e instanceof ApiError && e.status === 401) askForKey("This server needs an API key: type it above.");
    }
  }
  answer.finish(error);
  state.controller = null;
  busy(false);
  setStatus(error ? (error === "stopped" ? "Stopped." : "The request failed.") : "Done.");
  if (!error || answer.text()) {
    state.history.push({ role: "user", content: text }, { role: "assistant", content: answer.text() });
  }
  $("prompt").focus();
}

function wire() {
  $("chat-form").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); send(); }
  });
  $("cancel").addEventListener("click", () => state.controller && state.controller.abort());
  $("clear").addEventListener("click", () => {
    if (state.controller) state.controller.abort();
    state.history = [];
    clearLog();
    addNotice("New chat: the model sees only the messages from here on.");
    $("prompt").focus();
  });
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    setApiKey($("api-key").value);
    $("api-key").value = "";
    setStatus("Checking the key…");
    connect();
  });
  $("schema").addEventListener("input", () => {
    try {
      readSchema();
      $("schema-error").textContent = "";
      $("schema").removeAttribute("aria-invalid");
    } catch (e) {
      $("schema-error").textContent = e.message;
      $("schema").setAttribute("aria-invalid", "true");
    }
  });
  $("logprobs").addEventListener("change", () => {
    $("top_logprobs").disabled = !$("logprobs").checked;
    $("shade-legend").hidden = !$("logprobs").checked;
  });
  $("copy-curl").addEventListener("click", async () => {
    if (!state.lastBody) return setStatus("Send a message first: this copies the request it made.");
    const curl = asCurl(state.lastBody, hasApiKey() || !$("key-form").hidden);
    try {
      await navigator.clipboard.writeText(curl);
      setStatus("Copied the curl command.");
    } catch (_) {
      $("last-request").textContent = curl;
      setStatus("The clipboard is not available: the command is shown instead.");
    }
  });
  installTokenTips($("log"));
}

wire();
$("send").disabled = true;
connect();
new MetricsPanel($("metrics-panel"), $("metrics-status")).start();
