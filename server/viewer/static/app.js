// The viewer's entry point: a hash router (#/ for the list, #/s/<id> for a session) and the key form.

import { AuthNeeded, getKey, setKey } from "./api.js";
import { clear, h } from "./dom.js";
import { renderList } from "./list.js";
import { renderSession } from "./session.js";

const main = document.getElementById("main");
const forget = document.getElementById("forget-key");

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, query = ""] = raw.split("?");
  return { path, params: new URLSearchParams(query) };
}

function showKeyForm(message) {
  const input = h("input", { type: "password", id: "api-key", autocomplete: "off", required: true, size: 40 });
  const form = h(
    "form",
    {
      class: "key-form",
      onsubmit: (event) => {
        event.preventDefault();
        setKey(input.value.trim());
        route();
      },
    },
    h("h2", {}, "API key"),
    h("p", {}, message, ". The key is kept for this tab only and sent in the Authorization header."),
    h("label", { for: "api-key" }, "Session API key "),
    input,
    " ",
    h("button", { type: "submit" }, "Use key"),
  );
  clear(main).append(form);
  input.focus();
}

function showError(error) {
  clear(main).append(h("div", { class: "error", role: "alert" }, h("strong", {}, "Error: "), error.message));
}

async function route() {
  forget.hidden = !getKey();
  const { path, params } = parseHash();
  try {
    const sessionMatch = path.match(/^\/s\/([^/]+)$/);
    if (sessionMatch) {
      await renderSession(main, decodeURIComponent(sessionMatch[1]));
    } else {
      await renderList(main, params);
    }
    document.body.dataset.ready = "true";
  } catch (error) {
    if (error instanceof AuthNeeded) showKeyForm(error.message);
    else showError(error);
    document.body.dataset.ready = "true";
  }
}

forget.addEventListener("click", () => {
  setKey("");
  route();
});
window.addEventListener("hashchange", () => {
  document.body.dataset.ready = "false";
  route();
});
route();
