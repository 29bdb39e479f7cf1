// Talking to `atelier serve`: JSON requests with the API key as a Bearer token, the server-sent event stream
// of a job (read with fetch, since EventSource cannot send an Authorization header), and the alert region
// where every failure becomes a sentence a person can act on.
'use strict';
(function (A) {
  const KEY_STORAGE = 'atelier.apiKey';

  // A failed call: `status` is the HTTP status, 0 when the server could not be reached.
  class ApiError extends Error {
    constructor(message, status, retryAfterS) {
      super(message);
      this.status = status;
      this.retryAfterS = retryAfterS;
    }
  }
  A.ApiError = ApiError;

  A.apiKey = () => localStorage.getItem(KEY_STORAGE) || '';
  A.setApiKey = (key) => {
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
  };

  function headers(json) {
    const h = {};
    if (json) h['Content-Type'] = 'application/json';
    const key = A.apiKey();
    if (key) h.Authorization = 'Bearer ' + key;
    return h;
  }

  function unreachable() {
    return new ApiError('Server unreachable: no answer from ' + location.host +
                        '. Is `atelier serve` still running? The page retries on its own.', 0);
  }

  // The server's error body is {"error": {"message"}, "detail"}; a proxy may answer with anything else.
  async function errorFrom(res) {
    let detail = '';
    try {
      const j = await res.json();
      detail = (j.error && j.error.message) || j.detail || '';
    } catch (e) { /* not JSON: the status says enough */ }
    const retry = parseInt(res.headers.get('Retry-After') || '', 10);
    switch (res.status) {
      case 400: return new ApiError('The server rejected the request: ' + (detail || 'invalid input') + '.', 400);
      case 401: return new ApiError('The server needs an API key, or the one given is wrong: enter it under ' +
                                    '"API key" at the top of the page.', 401);
      case 404: return new ApiError('Not found: ' + (detail || res.url) + '.', 404);
      case 409: return new ApiError('Not possible now: ' + (detail || 'conflict') + '.', 409);
      case 413: return new ApiError('The request is larger than the server accepts (is the start image too big?).', 413);
      case 429: {
        const wait = Number.isFinite(retry) ? retry : 1;
        return new ApiError('The server is busy: its queue is full. Try again in ' + wait + ' s.', 429, wait);
      }
      case 503: return new ApiError('The server is not ready: ' + (detail || 'no healthy device') + '.', 503);
      case 504: return new ApiError('The job timed out on the server: ' + (detail || 'it took too long') + '.', 504);
      default: return new ApiError('The server answered HTTP ' + res.status + (detail ? ': ' + detail : '') + '.', res.status);
    }
  }

  // method, path, optional JSON body -> the parsed JSON answer; throws ApiError.
  A.request = async function (method, path, body) {
    let res;
    try {
      res = await fetch(path, {method: method, headers: headers(body !== undefined),
                               body: body !== undefined ? JSON.stringify(body) : undefined});
    } catch (e) {
      throw unreachable();
    }
    if (!res.ok) throw await errorFrom(res);
    A.clearAlert('network');
    try {
      return await res.json();
    } catch (e) {
      throw new ApiError('The server sent an answer this page cannot read (not JSON).', res.status);
    }
  };

  // Follows a server-sent event stream: onEvent(type, data) for each event. Resolves when the stream ends
  // (the server closes it after the terminal event); throws ApiError when it cannot be opened.
  A.followEvents = async function (path, onEvent) {
    let res;
    try {
      res = await fetch(path, {headers: headers(false)});
    } catch (e) {
      throw unreachable();
    }
    if (!res.ok) throw await errorFrom(res);
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (e) {
        throw unreachable();
      }
      if (chunk.done) return;
      buffer += decoder.decode(chunk.value, {stream: true});
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        dispatchFrame(buffer.slice(0, end), onEvent);
        buffer = buffer.slice(end + 2);
      }
    }
  };

  // One frame: "id: N", "event: TYPE", "data: JSON" lines; lines starting with ':' are keep-alive comments.
  function dispatchFrame(frame, onEvent) {
    let type = 'message';
    const data = [];
    for (const line of frame.split('\n')) {
      if (line.startsWith('event:')) type = line.slice(6).trim();
      else if (line.startsWith('data:')) data.push(line.slice(5).trimStart());
    }
    if (!data.length) return;
    let parsed;
    try {
      parsed = JSON.parse(data.join('\n'));
    } catch (e) {
      return;  // a frame this page does not understand is skipped, not fatal
    }
    onEvent(type, parsed);
  }

  // --- the alert region (role="alert", aria-live): one message at a time, the newest wins ---

  // kind: 'network' (cleared by the next call that reaches the server), 'http', 'info'.
  A.showAlert = function (text, kind, status) {
    const box = document.getElementById('alert');
    document.getElementById('alert-text').textContent = text;
    box.dataset.kind = kind || 'info';
    box.dataset.status = status === undefined ? '' : String(status);
    box.hidden = false;
  };

  A.showError = function (err) {
    if (err instanceof ApiError) A.showAlert(err.message, err.status === 0 ? 'network' : 'http', err.status);
    else A.showAlert('Something went wrong in the page: ' + (err && err.message ? err.message : String(err)), 'http');
  };

  // Hides the alert; with a kind, only when the alert shown is of that kind.
  A.clearAlert = function (kind) {
    const box = document.getElementById('alert');
    if (kind && box.dataset.kind !== kind) return;
    box.hidden = true;
  };

  // Last resort: an error no handler caught still reaches the user instead of leaving a broken page.
  window.addEventListener('error', (e) => A.showAlert('Something went wrong in the page: ' + e.message, 'http'));
  window.addEventListener('unhandledrejection', (e) => A.showError(e.reason));
})(window.Atelier = window.Atelier || {});
