// The gallery: every finished image with its parameters, a "Reuse" button that fills the form with them, and
// a download link holding the PNG bytes the server returned (they carry the A1111 `parameters` infotext).
// The newest entries are kept in localStorage within a size cap, so a reload keeps recent results.
'use strict';
(function (A) {
  const STORAGE = 'atelier.gallery';
  const MAX_ENTRIES = 60;
  const MAX_STORED_CHARS = 3 * 1024 * 1024;  // localStorage holds ~5 MB per origin: leave room for the rest
  const MIME = {png: 'image/png', jpeg: 'image/jpeg', webp: 'image/webp'};

  let entries = [];  // newest first: {key, jobId, index, seed, width, height, format, infotext, params, data, created}

  function load() {
    try {
      const stored = JSON.parse(localStorage.getItem(STORAGE) || '[]');
      entries = Array.isArray(stored) ? stored.filter((e) => e && e.data && e.params) : [];
    } catch (e) {
      entries = [];
    }
  }

  // Keeps the newest entries that fit the cap; on a quota error drops the oldest until it fits.
  function persist() {
    let kept = [], chars = 0;
    for (const e of entries) {
      chars += e.data.length + 2048;
      if (chars > MAX_STORED_CHARS || kept.length >= MAX_ENTRIES) break;
      kept.push(e);
    }
    while (kept.length) {
      try {
        localStorage.setItem(STORAGE, JSON.stringify(kept));
        return;
      } catch (err) {
        kept = kept.slice(0, kept.length - 1);
      }
    }
    localStorage.removeItem(STORAGE);
  }

  function summary(e) {
    const p = e.params;
    const parts = [e.width + '×' + e.height, (p.steps || 20) + ' steps', 'CFG ' + (p.cfg_scale === undefined ? 7 : p.cfg_scale)];
    if (p.sampler) parts.push(p.sampler);
    if (p.schedule && p.schedule !== 'default') parts.push(p.schedule);
    parts.push('seed ' + e.seed);
    if (p.model) parts.push(p.model);
    return parts.join(' · ');
  }

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function card(e) {
    const li = el('li', {'class': 'gallery-item', 'data-job-id': e.jobId, 'data-seed': String(e.seed)});
    const src = 'data:' + (MIME[e.format] || 'image/png') + ';base64,' + e.data;
    li.appendChild(el('img', {src: src, alt: e.params.prompt ? 'Generated: ' + e.params.prompt : 'Generated image',
                              width: String(e.width), height: String(e.height)}));
    li.appendChild(el('p', {'class': 'prompt'}, e.params.prompt || '(no prompt)'));
    li.appendChild(el('p', {'class': 'params muted'}, summary(e)));
    const details = el('details');
    details.appendChild(el('summary', {}, 'Parameters (as stored in the PNG)'));
    details.appendChild(el('pre', {'class': 'infotext'}, e.infotext || ''));
    li.appendChild(details);
    const actions = el('div', {'class': 'item-actions'});
    const reuse = el('button', {type: 'button', 'class': 'reuse'}, 'Reuse parameters');
    reuse.addEventListener('click', () => {
      A.form.fill(e.params, e.seed);
      document.getElementById('generate').scrollIntoView({behavior: 'smooth'});
      document.getElementById('prompt').focus({preventScroll: true});
      A.showAlert('The form now holds the parameters of that image (seed ' + e.seed + ').', 'info');
    });
    actions.appendChild(reuse);
    const name = 'atelier-' + e.jobId.slice(0, 12) + '-' + e.index + '.' + (e.format === 'jpeg' ? 'jpg' : e.format || 'png');
    actions.appendChild(el('a', {'class': 'download', href: src, download: name}, 'Download'));
    li.appendChild(actions);
    return li;
  }

  function render() {
    const list = document.getElementById('gallery');
    list.textContent = '';
    for (const e of entries) list.appendChild(card(e));
    if (!entries.length) list.appendChild(el('li', {'class': 'muted empty'}, 'No images yet.'));
  }

  // job: GET /v1/jobs/{id}'s document; params: the body that was submitted.
  function addJob(job, params) {
    const added = (job.images || []).map((img, i) => ({
      key: job.id + '-' + i, jobId: job.id, index: i, seed: img.seed, width: img.width, height: img.height,
      format: img.format || 'png', infotext: img.infotext || '', params: stripped(params), data: img.data,
      created: Date.now()}));
    entries = added.concat(entries.filter((e) => !added.some((a) => a.key === e.key)));
    render();
    persist();
  }

  // The start image and the mask are not kept with the entry (they may be megabytes); their settings are.
  function stripped(params) {
    const p = Object.assign({}, params);
    delete p.init_image;
    delete p.mask;
    return p;
  }

  function clear() {
    entries = [];
    localStorage.removeItem(STORAGE);
    render();
  }

  function init() {
    load();
    render();
    document.getElementById('gallery-clear').addEventListener('click', clear);
  }

  A.gallery = {init: init, addJob: addJob};
})(window.Atelier = window.Atelier || {});
