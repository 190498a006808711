// Talking to the server: the API key, JSON calls, and server-sent events from a streamed
// /v1/chat/completions (fetch + a ReadableStream, since EventSource can neither POST nor send
// an Authorization header).

const KEY_STORE = "fathom.apiKey";  // sessionStorage: forgotten when the tab closes

let apiKey = sessionStorage.getItem(KEY_STORE) || "";

export function setApiKey(key) {
  apiKey = key.trim();
  if (apiKey) sessionStorage.setItem(KEY_STORE, apiKey);
  else sessionStorage.removeItem(KEY_STORE);
}

export function hasApiKey() { return apiKey !== ""; }

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (apiKey) h["Authorization"] = "Bearer " + apiKey;
  return h;
}

// An error the server answered, with its HTTP status and OpenAI-shaped message.
export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code || "";
  }
}

async function errorOf(response) {
  let message = response.status + " " + response.statusText, code = "";
  try {
    const body = await response.json();
    if (body && body.error) {
      message = body.error.message || message;
      code = body.error.code || "";
    }
  } catch (_) { /* not JSON: keep the status line */ }
  return new ApiError(response.status, message, code);
}

export async function getJson(path) {
  const response = await fetch(path, { headers: headers(false), cache: "no-store" });
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

export async function getText(path) {
  const response = await fetch(path, { headers: headers(false), cache: "no-store" });
  if (!response.ok) throw await errorOf(response);
  return response.text();
}

// POSTs `body` and calls onEvent(object) for each `data: {...}` event until `data: [DONE]` or the
// end of the stream. `signal` aborts (the server then cancels the request).
export async function streamEvents(path, body, onEvent, signal) {
  const response = await fetch(path, {
    method: "POST", headers: headers(true), body: JSON.stringify(body), signal, cache: "no-store",
  });
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    // Events end with a blank line; "\r\n" is allowed by the SSE grammar.
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data === "") continue;        // a comment or keep-alive
      if (data === "[DONE]") return;
      onEvent(JSON.parse(data));
    }
  }
}
