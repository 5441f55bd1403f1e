// Talks to the server's JSON API. The key (when the server needs one) is kept for this tab only
// (sessionStorage) and sent in the Authorization header; it never goes into a URL.

const KEY_NAME = "switchyard-viewer-key";
// The API lives at the server root, one level above /ui/ (also under an /ng-rollout/<id>/ prefix).
const API_ROOT = new URL("../", document.baseURI);

// The server's own rule: printable ASCII without spaces, at most 200 characters, not only dots.
export const ID_PATTERN = /^(?!\.+$)[\x21-\x7e]{1,200}$/;

export class AuthNeeded extends Error {}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function getKey() {
  return sessionStorage.getItem(KEY_NAME) || "";
}

export function setKey(key) {
  if (key) sessionStorage.setItem(KEY_NAME, key);
  else sessionStorage.removeItem(KEY_NAME);
}

export function apiUrl(path, params) {
  const url = new URL(path.replace(/^\//, ""), API_ROOT);
  for (const [name, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, String(value));
  }
  return url;
}

export async function getJSON(path, params) {
  const headers = { Accept: "application/json" };
  const key = getKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(apiUrl(path, params), { headers, credentials: "omit", cache: "no-store" });
  if (response.status === 401) throw new AuthNeeded(key ? "that key was not accepted" : "this server needs a key");
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) message = body.error.message;
    } catch {
      /* not JSON: keep the status line */
    }
    throw new ApiError(response.status, message);
  }
  return response.json();
}

export function sessionPath(sessionId, tail = "") {
  if (!ID_PATTERN.test(sessionId)) throw new ApiError(400, `not a valid session id: ${sessionId.slice(0, 200)}`);
  return `/v1/sessions/${encodeURIComponent(sessionId)}${tail}`;
}
