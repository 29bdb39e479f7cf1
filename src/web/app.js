// Wiring: the API key form, the alert's close button, the form's submit (button or Ctrl+Enter), and the
// start of the gallery, the choices and the dashboard.
'use strict';
(function (A) {
  const $ = (id) => document.getElementById(id);

  async function generate() {
    A.clearAlert('http');  // an earlier refusal is stale once the user tries again
    const body = A.form.values();
    A.form.save();
    try {
      await A.jobs.submit(body);
    } catch (err) {
      A.showError(err);
    }
  }

  async function loadChoices() {
    try {
      await A.form.loadChoices();
    } catch (err) {
      A.showError(err);
    }
  }

  function initKey() {
    $('api-key').value = A.apiKey();
    $('key-form').addEventListener('submit', (e) => {
      e.preventDefault();
      A.setApiKey($('api-key').value.trim());
      A.showAlert($('api-key').value.trim() ? 'API key saved in this browser.' : 'API key removed.', 'info');
      loadChoices();
    });
  }

  function init() {
    $('alert-close').addEventListener('click', () => A.clearAlert());
    initKey();
    A.form.init();
    A.gallery.init();
    $('gen-form').addEventListener('submit', (e) => {
      e.preventDefault();
      generate();
    });
    document.addEventListener('keydown', (e) => {
      if ((e.ctrlKey || e.metaKey) && e.key === 'Enter') {
        e.preventDefault();
        generate();
      }
    });
    loadChoices();
    A.dashboard.start();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init);
  else init();
})(window.Atelier = window.Atelier || {});
