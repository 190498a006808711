// The settings form -> a /v1/chat/completions body (docs/api.md). Only what the user set is sent:
// an empty field leaves the server's (or the model's) default in force.

// A setting the user must fix; `field` is the id of the input to focus.
export class SettingError extends Error {
  constructor(field, message) {
    super(message);
    this.field = field;
  }
}

function value(id) { return document.getElementById(id).value.trim(); }

function number(id, { min, max, integer }) {
  const text = value(id);
  if (text === "") return undefined;
  const x = Number(text);
  const label = document.querySelector(`label[for="${id}"]`).textContent.trim();
  if (!Number.isFinite(x) || (integer && !Number.isInteger(x)))
    throw new SettingError(id, `${label} must be ${integer ? "a whole number" : "a number"}`);
  if ((min !== undefined && x < min) || (max !== undefined && x > max))
    throw new SettingError(id, `${label} must be between ${min} and ${max}`);
  return x;
}

// The JSON schema box: undefined when empty; throws SettingError when it is not a JSON object.
export function readSchema() {
  const text = value("schema");
  if (text === "") return undefined;
  let schema;
  try {
    schema = JSON.parse(text);
  } catch (e) {
    throw new SettingError("schema", "The JSON schema is not valid JSON: " + e.message);
  }
  if (schema === null || typeof schema !== "object" || Array.isArray(schema))
    throw new SettingError("schema", "The JSON schema must be a JSON object");
  return schema;
}

// `history`: [{role, content}] of the conversation so far, the new user turn last.
export function buildChatRequest(model, history, maxN) {
  const body = { model, messages: [], stream: true, stream_options: { include_usage: true } };
  const system = value("system");
  if (system) body.messages.push({ role: "system", content: system });
  body.messages.push(...history);

  const set = (key, x) => { if (x !== undefined) body[key] = x; };
  set("temperature", number("temperature", { min: 0, max: 2 }));
  set("top_p", number("top_p", { min: 0, max: 1 }));
  set("max_tokens", number("max_tokens", { min: 1, max: 1 << 24, integer: true }));
  set("seed", number("seed", { min: -(2 ** 53), max: 2 ** 53, integer: true }));
  const n = number("n", { min: 1, max: maxN, integer: true });
  if (n !== undefined && n !== 1) body.n = n;

  const stops = document.getElementById("stop").value.split("\n").filter((s) => s !== "");
  if (stops.length > 4) throw new SettingError("stop", "At most 4 stop sequences");
  if (stops.length) body.stop = stops;

  if (document.getElementById("logprobs").checked) {
    body.logprobs = true;
    set("top_logprobs", number("top_logprobs", { min: 0, max: 20, integer: true }));
  }
  const schema = readSchema();
  if (schema) body.response_format = { type: "json_schema", json_schema: { name: "playground", schema, strict: true } };

  const fathom = {};
  const policy = value("attention");
  if (policy) fathom.attention = policy;
  const ratio = number("kv_read_ratio", { min: 0.001, max: 1 });
  if (ratio !== undefined) fathom.kv_read_ratio = ratio;
  const speculative = value("speculative");
  if (speculative) fathom.speculative = speculative;
  if (Object.keys(fathom).length) body.fathom = fathom;
  return body;
}

// The same request as a shell command (the key as a variable: it never lands in a clipboard).
export function asCurl(body, withKey) {
  const url = new URL("/v1/chat/completions", location.href).href;
  const quote = (s) => "'" + s.replace(/'/g, "'\\''") + "'";
  const lines = [`curl -N ${url}`, "-H 'Content-Type: application/json'"];
  if (withKey) lines.push("-H \"Authorization: Bearer $FATHOM_API_KEY\"");
  lines.push("-d " + quote(JSON.stringify(body)));
  return lines.join(" \\\n  ");
}
