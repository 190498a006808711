// The token tooltip: a token's probability and the alternatives the model weighed, shown when the
// pointer rests on a .tok span, or, from the keyboard, when an answer has focus and the arrow keys
// move along its tokens (the same text is then announced through the #announce live region).

const answers = new WeakMap();  // .msg.assistant node -> its Answer (chat.js)

export function registerAnswer(answer) { answers.set(answer.node, answer); }

// Whitespace made visible: a token that is a space or a newline must still show in the tip.
function visible(token) {
  return token.replace(/ /g, "␣").replace(/\n/g, "⏎").replace(/\t/g, "⇥") || "∅";
}

function percent(logprob) {
  const p = Math.exp(logprob) * 100;
  return p >= 10 ? p.toFixed(1) + "%" : p >= 0.01 ? p.toFixed(2) + "%" : "<0.01%";
}

function row(table, token, logprob, chosen) {
  const tr = document.createElement("tr");
  if (chosen) tr.className = "chosen";
  const name = document.createElement("td");
  name.className = "t";
  name.textContent = visible(token);
  const bar = document.createElement("td");
  bar.className = "bar";
  const meter = document.createElement("meter");
  meter.min = 0;
  meter.max = 1;
  meter.value = Math.exp(logprob);
  bar.append(meter);
  const p = document.createElement("td");
  p.className = "p";
  p.textContent = percent(logprob);
  tr.append(name, bar, p);
  table.append(tr);
}

// Fills the tip for a span; returns its text for the live region.
function fill(tip, entries) {
  tip.replaceChildren();
  const said = [];
  for (const e of entries) {
    const head = document.createElement("div");
    head.className = "head";
    head.textContent = `“${visible(e.token)}”  p = ${percent(e.logprob)}  (logprob ${e.logprob.toFixed(3)})`;
    tip.append(head);
    said.push(`token ${visible(e.token)}, probability ${percent(e.logprob)}`);
    const alternatives = e.top_logprobs || [];
    if (alternatives.length) {
      const table = document.createElement("table");
      for (const a of alternatives) row(table, a.token, a.logprob, a.token === e.token);
      tip.append(table);
      const others = alternatives.filter((a) => a.token !== e.token).slice(0, 3);
      if (others.length) said.push("alternatives " + others.map((a) => `${visible(a.token)} ${percent(a.logprob)}`).join(", "));
    }
  }
  if (!entries.length) tip.textContent = "No probabilities for this text.";
  return said.join("; ");
}

function place(tip, span) {
  const r = span.getBoundingClientRect();
  tip.hidden = false;
  const w = tip.offsetWidth, h = tip.offsetHeight;
  const left = Math.max(4, Math.min(window.innerWidth - w - 4, r.left));
  const below = r.bottom + 6 + h < window.innerHeight;
  tip.style.left = left + "px";
  tip.style.top = (below ? r.bottom + 6 : Math.max(4, r.top - h - 6)) + "px";
}

function show(span, announce) {
  const node = span.closest(".msg.assistant");
  const answer = node && answers.get(node);
  if (!answer) return;
  const tip = document.getElementById("tip");
  const said = fill(tip, answer.entriesOf(span));
  place(tip, span);
  document.querySelectorAll(".tok.active").forEach((t) => t.classList.remove("active"));
  span.classList.add("active");
  if (announce) document.getElementById("announce").textContent = said;
}

function hide() {
  document.getElementById("tip").hidden = true;
  document.querySelectorAll(".tok.active").forEach((t) => t.classList.remove("active"));
}

export function installTokenTips(log) {
  log.addEventListener("pointerover", (e) => {
    const span = e.target.closest(".tok");
    if (span) show(span, false);
  });
  log.addEventListener("pointerout", (e) => {
    if (e.target.closest(".tok") && !(e.relatedTarget && e.relatedTarget.closest && e.relatedTarget.closest(".tok"))) hide();
  });
  log.addEventListener("keydown", (e) => {
    const text = e.target.closest(".text");
    if (!text || text.tabIndex !== 0) return;
    if (e.key === "Escape") return hide();
    const step = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1, Home: -Infinity, End: Infinity }[e.key];
    if (step === undefined) return;
    const tokens = [...text.querySelectorAll(".tok")];
    if (!tokens.length) return;
    e.preventDefault();
    const at = tokens.findIndex((t) => t.classList.contains("active"));
    const next = Number.isFinite(step) ? Math.max(0, Math.min(tokens.length - 1, (at < 0 ? -step : at) + step))
      : step < 0 ? 0 : tokens.length - 1;
    tokens[next].scrollIntoView({ block: "nearest" });
    show(tokens[next], true);
  });
  log.addEventListener("focusout", (e) => { if (e.target.closest(".text")) hide(); });
  window.addEventListener("scroll", hide, { passive: true });
  log.addEventListener("scroll", hide, { passive: true });
}
