// DOM building without HTML parsing: every piece of text becomes a text node, so model and tool
// output can never turn into markup. Nothing in this viewer assigns innerHTML.

export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "open" || name === "hidden" || name === "disabled" || name === "selected") el[name] = Boolean(value);
    else if (name === "value") el.value = value;
    // Through the CSSOM, which the page's Content-Security-Policy allows (a style attribute it would not).
    else if (name === "style") el.style.cssText = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

export function fmtInt(n) {
  return typeof n === "number" ? n.toLocaleString("en-US") : "–";
}

export function fmtMs(ms) {
  if (typeof ms !== "number") return "–";
  if (ms < 1000) return `${ms.toFixed(0)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(2)} s`;
  return `${(ms / 60000).toFixed(1)} min`;
}

export function fmtTime(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return d.toISOString().replace("T", " ").slice(0, 19) + "Z";
}

// Message content: a string, or a list of parts (text parts joined; anything else shown as JSON).
export function contentText(content) {
  if (content === undefined || content === null) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content
      .map((part) => (part && typeof part.text === "string" ? part.text : JSON.stringify(part)))
      .join("\n");
  }
  return JSON.stringify(content, null, 2);
}

export function prettyArgs(args) {
  if (typeof args !== "string") return JSON.stringify(args, null, 2);
  try {
    return JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    return args;
  }
}

export function badge(text, kind) {
  return h("span", { class: `badge ${kind || ""}` }, text);
}
