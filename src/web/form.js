// The generation form: choices loaded from the server (models, samplers, schedules), size presets, seed
// modes, the img2img start image (file or drop) and the inpainting mask, the request body it produces, the last settings kept in
// localStorage, and filling it back from a gallery entry's parameters.
'use strict';
(function (A) {
  const SETTINGS_STORAGE = 'atelier.settings';
  const LAST_SEED_STORAGE = 'atelier.lastSeed';
  const MAX_INIT_IMAGE_BYTES = 24 << 20;  // below the server's default body limit (32 MiB) once base64-encoded
  // Fields sent as they are typed (numbers when the field is a number input).
  const TEXT_FIELDS = ['prompt', 'negative_prompt'];
  const NUMBER_FIELDS = ['width', 'height', 'steps', 'cfg_scale', 'batch_size', 'batch_count', 'clip_skip'];
  const SELECT_FIELDS = ['model', 'sampler', 'schedule'];
  const DEFAULT_SAMPLER = 'euler_a';  // the server's (and A1111's) default, preselected on a first visit

  const $ = (id) => document.getElementById(id);
  let initImage = null;  // data URL of the start image, or null
  let maskImage = null;  // data URL of the inpainting mask, or null
  let families = {};  // model id -> family, from GET /v1/models

  function numberOf(id) {
    const v = $(id).value.trim();
    return v === '' ? undefined : Number(v);
  }

  function fillSelect(select, options) {
    const kept = select.value;
    select.textContent = '';
    for (const o of options) {
      const opt = document.createElement('option');
      opt.value = o.value;
      opt.textContent = o.label;
      select.appendChild(opt);
    }
    if (options.some((o) => o.value === kept)) select.value = kept;
  }

  // Loads the models, samplers and schedules; throws ApiError (shown by the caller).
  async function loadChoices() {
    const [models, samplers, schedulers] = await Promise.all([
      A.request('GET', '/v1/models'), A.request('GET', '/sdapi/v1/samplers'), A.request('GET', '/sdapi/v1/schedulers')]);
    const list = models.data.slice().sort((a, b) => (b.default === true) - (a.default === true));
    families = Object.fromEntries(list.map((m) => [m.id, m.family || 'sd']));
    fillSelect($('model'), list.map((m) => ({value: m.id, label: m.id + (m.default ? ' (default)' : '')})));
    // Ours (the alias) is what /v1/jobs reads; A1111's name is what people know.
    fillSelect($('sampler'), samplers.map((s) => ({value: (s.aliases && s.aliases[0]) || s.name, label: s.name})));
    fillSelect($('schedule'), schedulers.map((s) => ({value: s.name === 'automatic' ? 'default' : s.name, label: s.label})));
    if (!localStorage.getItem(SETTINGS_STORAGE)) setSelect('sampler', DEFAULT_SAMPLER);
    restore();
    updateModelControls();
  }

  // The selected model's family ("sd", "flux", "zimage": GET /v1/models).
  function family() {
    return families[$('model').value] || 'sd';
  }

  // What the selected model takes. FLUX models take a distilled guidance value (sent as "guidance") rather than
  // classifier-free guidance; Z-Image-Turbo runs with CFG off (0). Both run flow-matching Euler: no sampler,
  // schedule or CLIP skip to choose. Every family takes a start image (img2img) and a mask (inpainting).
  function updateModelControls() {
    const f = family();
    $('cfg-label').textContent = f === 'flux' ? 'Guidance' : f === 'zimage' ? 'CFG scale (Turbo: 0)' : 'CFG scale';
    for (const id of ['sampler', 'schedule', 'clip_skip']) $(id).closest('.field').hidden = f !== 'sd';
    // Inpainting: every family; A1111's mask settings are SD's (FLUX and Z-Image inpaint as FluxInpaintPipeline).
    for (const field of document.querySelectorAll('.field.inpaint-sd')) field.hidden = f !== 'sd';
    $('mask-paint').hidden = !initImage;  // painting needs the start image under it
    if (initImage) A.maskPainter.render();
  }

  function onPresetChange() {
    const v = $('size-preset').value;
    if (v === 'custom') return $('width').focus();
    const [w, h] = v ? v.split('x') : ['', ''];
    $('width').value = w;
    $('height').value = h;
  }

  function syncPreset() {
    const w = $('width').value, h = $('height').value;
    const key = w === '' && h === '' ? '' : w + 'x' + h;
    const known = Array.from($('size-preset').options).some((o) => o.value === key);
    $('size-preset').value = known ? key : 'custom';
  }

  function syncSeedMode() {
    const mode = $('seed-mode').value;
    const seed = $('seed');
    seed.disabled = mode !== 'fixed';
    if (mode === 'last') seed.value = localStorage.getItem(LAST_SEED_STORAGE) || '';
    if (mode === 'random') seed.value = '';
  }

  // An uploaded image slot: the start image ('init') or the mask ('mask'), its preview and its remove button.
  const SLOTS = {
    init: {input: 'init_image', preview: 'init-preview', clear: 'init-clear', what: 'start image',
           set: (v) => {
             initImage = v;
             A.maskPainter.setImage(v);
             updateModelControls();
           }},
    mask: {input: 'mask_image', preview: 'mask-preview', clear: 'mask-clear', what: 'mask', set: (v) => { maskImage = v; }},
  };

  function setImage(slot, dataUrl) {
    const s = SLOTS[slot];
    s.set(dataUrl);
    $(s.preview).hidden = !dataUrl;
    $(s.clear).hidden = !dataUrl;
    if (dataUrl) $(s.preview).src = dataUrl;
    else $(s.preview).removeAttribute('src');
    if (!dataUrl) $(s.input).value = '';
  }

  function readImageFile(slot, file) {
    if (!file) return;
    const what = SLOTS[slot].what;
    if (!/^image\/(png|jpeg|webp)$/.test(file.type))
      return A.showAlert('The ' + what + ' must be a PNG, JPEG or WebP file (this one is "' + (file.type || 'unknown') + '").', 'http');
    if (file.size > MAX_INIT_IMAGE_BYTES)
      return A.showAlert('The ' + what + ' is too large (' + Math.round(file.size / 1048576) + ' MiB; at most 24 MiB).', 'http');
    const reader = new FileReader();
    reader.onload = () => setImage(slot, reader.result);
    reader.onerror = () => A.showAlert('Could not read the ' + what + ' file.', 'http');
    reader.readAsDataURL(file);
  }

  function initDrop() {
    const zone = $('drop-zone');
    zone.addEventListener('dragover', (e) => {
      e.preventDefault();
      zone.classList.add('dragging');
    });
    zone.addEventListener('dragleave', () => zone.classList.remove('dragging'));
    zone.addEventListener('drop', (e) => {
      e.preventDefault();
      zone.classList.remove('dragging');
      if (e.dataTransfer.files.length) readImageFile('init', e.dataTransfer.files[0]);
    });
    for (const slot of Object.keys(SLOTS)) {
      $(SLOTS[slot].input).addEventListener('change', (e) => readImageFile(slot, e.target.files[0]));
      $(SLOTS[slot].clear).addEventListener('click', () => setImage(slot, null));
    }
  }

  // The POST /v1/jobs body (seed resolved from the seed mode). Invalid values are sent as typed: the
  // server checks them and its message names the field.
  function values() {
    const body = {};
    for (const id of TEXT_FIELDS) body[id] = $(id).value;
    for (const id of NUMBER_FIELDS) if (numberOf(id) !== undefined) body[id] = numberOf(id);
    for (const id of SELECT_FIELDS) if ($(id).value) body[id] = $(id).value;
    if (family() === 'flux' && body.cfg_scale !== undefined) {
      body.guidance = body.cfg_scale;
      delete body.cfg_scale;
    }
    const mode = $('seed-mode').value;
    const seed = mode === 'last' ? Number(localStorage.getItem(LAST_SEED_STORAGE) || -1) : numberOf('seed');
    body.seed = mode === 'random' || seed === undefined ? -1 : seed;
    body.preview = $('preview').checked;
    if (initImage) {
      body.init_image = initImage;
      if (numberOf('strength') !== undefined) body.strength = numberOf('strength');
      const mask = maskImage || A.maskPainter.mask();  // a mask file, else what is painted on the image
      if (mask) body.mask = mask;
      if (mask && family() === 'sd') {
        if (numberOf('mask_blur') !== undefined) body.mask_blur = numberOf('mask_blur');
        body.inpaint_fill = $('inpaint_fill').value;
        body.inpaint_only_masked = $('inpaint_only_masked').checked;
      }
    }
    return body;
  }

  function save() {
    const s = {seedMode: $('seed-mode').value, seed: $('seed').value, preview: $('preview').checked,
               strength: $('strength').value};
    for (const id of TEXT_FIELDS.concat(NUMBER_FIELDS, SELECT_FIELDS)) s[id] = $(id).value;
    try {
      localStorage.setItem(SETTINGS_STORAGE, JSON.stringify(s));
    } catch (e) { /* storage full or disabled: settings are a convenience */ }
  }

  function restore() {
    let s;
    try {
      s = JSON.parse(localStorage.getItem(SETTINGS_STORAGE) || 'null');
    } catch (e) {
      s = null;
    }
    if (!s) return;
    for (const id of TEXT_FIELDS.concat(NUMBER_FIELDS)) if (typeof s[id] === 'string') $(id).value = s[id];
    for (const id of SELECT_FIELDS) setSelect(id, s[id]);
    if (s.seedMode) $('seed-mode').value = s.seedMode;
    if (typeof s.seed === 'string') $('seed').value = s.seed;
    if (typeof s.strength === 'string') $('strength').value = s.strength;
    if (typeof s.preview === 'boolean') $('preview').checked = s.preview;
    syncPreset();
    syncSeedMode();
  }

  function setSelect(id, value) {
    if (value === undefined || value === null) return;
    if (Array.from($(id).options).some((o) => o.value === String(value))) $(id).value = String(value);
  }

  // Fills the form from a job's parameters (a gallery entry's), with its seed fixed.
  function fill(params, seed) {
    for (const id of TEXT_FIELDS) $(id).value = params[id] || '';
    for (const id of NUMBER_FIELDS) $(id).value = params[id] === undefined ? '' : String(params[id]);
    if (params.guidance !== undefined) $('cfg_scale').value = String(params.guidance);  // a FLUX job's (values())
    for (const id of SELECT_FIELDS) setSelect(id, params[id]);
    $('seed-mode').value = 'fixed';
    syncSeedMode();
    $('seed').value = String(seed);
    if (params.strength !== undefined) $('strength').value = String(params.strength);
    if (typeof params.preview === 'boolean') $('preview').checked = params.preview;
    syncPreset();
    updateModelControls();
    save();
  }

  function setLastSeed(seed) {
    localStorage.setItem(LAST_SEED_STORAGE, String(seed));
    if ($('seed-mode').value === 'last') $('seed').value = String(seed);
  }

  function init() {
    $('size-preset').addEventListener('change', onPresetChange);
    for (const id of ['width', 'height'])
      for (const type of ['input', 'change']) $(id).addEventListener(type, syncPreset);
    $('seed-mode').addEventListener('change', syncSeedMode);
    $('model').addEventListener('change', updateModelControls);
    $('gen-form').addEventListener('change', save);
    initDrop();
    A.maskPainter.init();
    restore();
  }

  A.form = {init: init, loadChoices: loadChoices, values: values, save: save, fill: fill, setLastSeed: setLastSeed,
            hasInitImage: () => initImage !== null};
})(window.Atelier = window.Atelier || {});
