// The conversation on the page: user turns, and answers that grow chunk by chunk from the SSE
// stream. With logprobs each chunk's text is one <span class="tok"> (usually one token; a
// character split over several tokens arrives as one chunk holding them all), shaded by the
// token's probability; its logprob entries stay in JS (never in the DOM) for the tooltip.

const log = () => document.getElementById("log");

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

// Keeps the newest text in view unless the user scrolled up to read.
function follow(fn) {
  const box = log();
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  fn();
  if (atBottom) box.scrollTop = box.scrollHeight;
}

export function clearLog() {
  log().replaceChildren();
}

export function addUserTurn(text) {
  follow(() => {
    const turn = el("div", "msg user");
    turn.append(el("div", "who", "You"), el("div", "text", text));
    log().append(turn);
  });
}

export function addNotice(text, kind) {
  follow(() => {
    const p = el("p", "notice " + (kind || ""), text);
    if (kind === "error") p.setAttribute("role", "alert");
    log().append(p);
  });
}

// Probability bucket of a token (the lowest of a chunk's tokens): a CSS class.
function shade(entries) {
  if (!entries.length) return "";
  const p = Math.min(...entries.map((e) => Math.exp(e.logprob)));
  return p >= 0.9 ? "p90" : p >= 0.5 ? "p50" : p >= 0.1 ? "p10" : "p0";
}

export class Answer {
  constructor(n, withProbs) {
    this.withProbs = withProbs;
    this.choices = [];
    this.usage = null;
    this.started = performance.now();
    this.firstTokenAt = 0;
    this.node = el("div", "msg assistant");
    this.node.append(el("div", "who", n > 1 ? `Model — ${n} choices` : "Model"));
    this.grid = el("div", n > 1 ? "choices many" : "choices");
    this.stats = el("div", "stats", "waiting for the first token…");
    this.node.append(this.grid, this.stats);
    this.node.setAttribute("aria-busy", "true");
    follow(() => log().append(this.node));
    for (let i = 0; i < n; ++i) this.choice(i);
  }

  choice(i) {
    while (this.choices.length <= i) {
      const index = this.choices.length;
      const box = el("div", "choice");
      if (this.grid.classList.contains("many")) box.append(el("div", "label", `Choice ${index + 1}`));
      const text = el("div", "text");
      if (this.withProbs) {
        text.tabIndex = 0;
        text.setAttribute("aria-label", `Answer ${index + 1}: use the arrow keys to read each token's probability`);
      }
      box.append(text);
      this.grid.append(box);
      this.choices.push({ box, text, reasoning: null, content: "", tokens: [], pending: [], finish: "", count: 0 });
    }
    return this.choices[i];
  }

  // One parsed SSE chunk of /v1/chat/completions.
  add(chunk) {
    if (chunk.error) throw new Error(chunk.error.message || "the server reported an error");
    if (chunk.usage) this.usage = chunk.usage;
    follow(() => {
      for (const c of chunk.choices || []) {
        const ch = this.choice(c.index || 0);
        const delta = c.delta || {};
        const entries = (c.logprobs && c.logprobs.content) || [];
        ch.pending.push(...entries);
        ch.count += entries.length;
        if (delta.reasoning_content) this.addReasoning(ch, delta.reasoning_content);
        if (delta.content) this.addText(ch, delta.content);
        if (c.finish_reason) ch.finish = c.finish_reason;
      }
    });
  }

  addReasoning(ch, text) {
    if (!ch.reasoning) {
      const details = el("details", "reasoning");
      details.open = true;
      details.append(el("summary", "", "Thinking"));
      ch.reasoning = el("div", "text");
      details.append(ch.reasoning);
      ch.box.insertBefore(details, ch.text);
    }
    this.markFirst();
    ch.reasoning.append(text);
  }

  addText(ch, text) {
    this.markFirst();
    ch.content += text;
    if (!this.withProbs) {
      ch.text.append(text);
      return;
    }
    const span = el("span", "tok " + shade(ch.pending), text);
    span.dataset.choice = String(this.choices.indexOf(ch));
    span.dataset.token = String(ch.tokens.length);
    ch.tokens.push(ch.pending);
    ch.pending = [];
    ch.text.append(span);
  }

  markFirst() {
    if (!this.firstTokenAt) this.firstTokenAt = performance.now();
  }

  // The token entries behind a .tok span of this answer.
  entriesOf(span) {
    const ch = this.choices[Number(span.dataset.choice)];
    return ch ? ch.tokens[Number(span.dataset.token)] || [] : [];
  }

  finish(error) {
    this.node.removeAttribute("aria-busy");
    const seconds = (performance.now() - this.started) / 1000;
    const tokens = this.usage ? this.usage.completion_tokens : this.choices.reduce((s, c) => s + c.count, 0);
    const parts = [];
    if (tokens) parts.push(`${tokens} tokens`);
    if (this.firstTokenAt) parts.push(`first token after ${((this.firstTokenAt - this.started) / 1000).toFixed(2)} s`);
    if (this.firstTokenAt && tokens > 1) {
      const decode = (performance.now() - this.firstTokenAt) / 1000;
      if (decode > 0) parts.push(`${((tokens - this.choices.length) / decode).toFixed(1)} tokens/s`);
    }
    if (this.usage) {
      const cached = (this.usage.prompt_tokens_details || {}).cached_tokens || 0;
      parts.push(`prompt ${this.usage.prompt_tokens} tokens` + (cached ? ` (${cached} cached)` : ""));
    }
    const reasons = [...new Set(this.choices.map((c) => c.finish).filter(Boolean))];
    if (reasons.length) parts.push("finish: " + reasons.join(", "));
    if (error) parts.push(error);
    this.stats.textContent = parts.join(" · ") || `no answer (${seconds.toFixed(1)} s)`;
    for (const ch of this.choices) {
      if (!ch.content && !ch.reasoning) ch.text.append(el("span", "muted", error ? "(stopped)" : "(empty answer)"));
    }
  }

  // The text that continues the conversation: the first choice's.
  text() { return this.choices.length ? this.choices[0].content : ""; }
}
