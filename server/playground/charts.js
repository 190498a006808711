// Small inline-SVG charts: a line chart of a few series over the last samples (scaled to their
// maximum), and a horizontal bar. No library; colours come from CSS classes s0..s4.

const SVG = "http://www.w3.org/2000/svg";
const W = 200, H = 48;  // viewBox units; the SVG stretches to the card's width

function svgEl(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

// A chart card: title, a legend line per series (its latest value), the plot.
export class LineChart {
  // series: [{name, format(value) -> text}]; `fixedMax`: the y range's top (e.g. 1 for ratios),
  // else the largest value shown.
  constructor(parent, title, series, { capacity = 60, fixedMax = 0, summary } = {}) {
    this.series = series.map((s, i) => ({ ...s, values: [], cls: "s" + i }));
    this.capacity = capacity;
    this.fixedMax = fixedMax;
    this.summary = summary;
    this.card = document.createElement("figure");
    this.card.className = "card";
    const caption = document.createElement("figcaption");
    caption.textContent = title;
    this.legend = document.createElement("ul");
    this.legend.className = "legend";
    this.items = this.series.map((s) => {
      const li = document.createElement("li");
      li.className = s.cls;
      this.legend.append(li);
      return li;
    });
    this.svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
    this.svg.append(svgEl("line", { x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5, class: "axis" }));
    this.lines = this.series.map((s) => {
      const line = svgEl("polyline", { class: "line " + s.cls, fill: "none" });
      this.svg.append(line);
      return line;
    });
    this.card.append(caption, this.legend, this.svg);
    parent.append(this.card);
    this.render();
  }

  // One sample per series (null: no value this time).
  push(values) {
    this.series.forEach((s, i) => {
      s.values.push(values[i] === null || values[i] === undefined ? null : values[i]);
      if (s.values.length > this.capacity) s.values.shift();
    });
    this.render();
  }

  render() {
    let max = this.fixedMax;
    if (!max) for (const s of this.series) for (const v of s.values) if (v !== null && v > max) max = v;
    if (!max) max = 1;
    const step = W / (this.capacity - 1);
    this.series.forEach((s, i) => {
      const offset = this.capacity - s.values.length;
      // A sample without a value (no rate yet, no lookups in the interval) is left out, not drawn as 0.
      const points = [];
      s.values.forEach((v, j) => {
        if (v !== null) points.push(`${((offset + j) * step).toFixed(1)},${(H - 1 - (v / max) * (H - 4)).toFixed(1)}`);
      });
      this.lines[i].setAttribute("points", points.join(" "));
      const last = s.values.length ? s.values[s.values.length - 1] : null;
      this.items[i].textContent = `${s.name}: ${last === null ? "—" : s.format(last)}`;
    });
    const label = this.series.map((s, i) => this.items[i].textContent).join(", ");
    this.svg.setAttribute("aria-label", (this.summary ? this.summary + ": " : "") + label + ` (max ${this.series[0].format(max)})`);
  }
}

// A card of labelled horizontal bars (value / total), e.g. KV blocks per tier.
export class Bars {
  // Without a title the bars are a list inside `parent` (another card), not a card of their own.
  constructor(parent, title) {
    this.list = document.createElement("ul");
    this.list.className = "bars";
    if (title) {
      this.card = document.createElement("figure");
      this.card.className = "card";
      const caption = document.createElement("figcaption");
      caption.textContent = title;
      this.card.append(caption, this.list);
      parent.append(this.card);
    } else {
      parent.append(this.list);
    }
  }

  // rows: [{name, fraction in [0, 1], text}]
  set(rows) {
    this.list.replaceChildren(...rows.map((r, i) => {
      const li = document.createElement("li");
      li.className = "s" + i;
      const name = document.createElement("span");
      name.className = "name";
      name.textContent = r.name;
      const meter = document.createElement("meter");
      meter.min = 0;
      meter.max = 1;
      meter.value = Math.max(0, Math.min(1, r.fraction));
      meter.setAttribute("aria-label", `${r.name}: ${r.text}`);
      const text = document.createElement("span");
      text.className = "num";
      text.textContent = r.text;
      li.append(name, meter, text);
      return li;
    }));
  }
}
