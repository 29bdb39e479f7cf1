// Jobs: submit the form's request to POST /v1/jobs, then show each job as a card — queue position, a progress
// bar that moves with every step event, the live preview, an ETA and a cancel button — until it ends; done
// jobs' images go to the gallery.
'use strict';
(function (A) {
  const QUEUE_POLL_MS = 1000;    // queue position refresh while a job waits
  const FALLBACK_POLL_MS = 500;  // polling when a job has no event stream (or it broke before the end)
  // A browser opens at most 6 HTTP/1.1 connections to one server and an event stream holds one for the whole
  // job: past this many, jobs are polled, so that submissions and the dashboard never wait for a free one.
  // (A setting rather than a constant so that the UI test can exercise the polling path.)
  const options = {maxStreams: 3};
  const MAX_FINISHED_CARDS = 6;  // finished jobs kept visible above the gallery
  const TERMINAL = ['done', 'failed', 'cancelled'];
  const MIN_ETA_SPAN_MS = 100;  // the step rate behind the ETA is measured over at least this long
  const NARROW_SCREEN = '(max-width: 760px)';  // app.css's one-column layout

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // One job on the page: its card and what it has seen of the job so far.
  class JobView {
    constructor(id, params, queuePosition) {
      this.id = id;
      this.params = params;
      this.firstStep = null;  // {step, t} of the first step event: the ETA's reference
      this.finished = false;
      this.card = this.build();
      this.setState('queued');
      this.setQueued(queuePosition);
    }

    build() {
      const li = el('li', 'job');
      li.dataset.jobId = this.id;
      const title = el('p', 'job-title', this.params.prompt || '(no prompt)');
      // The status line carries the ETA too: in the bar's row, its text appearing a few steps in wrapped the Cancel
      // button onto a new line just as people (and the UI test) reached for it.
      this.status = el('p', 'job-status');
      this.status.setAttribute('aria-live', 'polite');
      this.statusText = el('span', 'job-status-text');
      this.bar = el('progress', 'job-progress');
      this.bar.max = 1;
      this.bar.value = 0;
      const barId = 'progress-' + this.id;
      this.bar.id = barId;
      const barLabel = el('label', 'visually-hidden', 'Progress of job ' + this.id.slice(0, 8));
      barLabel.htmlFor = barId;
      this.eta = el('span', 'job-eta muted');
      this.status.append(this.statusText, this.eta);
      this.preview = el('img', 'job-preview');
      this.preview.alt = 'live preview of the image being generated';
      this.preview.hidden = true;
      this.cancelBtn = el('button', 'job-cancel', 'Cancel');
      this.cancelBtn.type = 'button';
      this.cancelBtn.setAttribute('aria-label', 'Cancel job ' + this.id.slice(0, 8));
      this.cancelBtn.addEventListener('click', () => this.cancel());
      const row = el('div', 'job-row');
      row.append(barLabel, this.bar, this.cancelBtn);
      const thumb = el('div', 'job-thumb');  // holds the preview's place before the first one arrives
      thumb.appendChild(this.preview);
      li.append(thumb, title, this.status, row);
      return li;
    }

    setState(state) {
      this.card.dataset.state = state;
      if (TERMINAL.includes(state)) {
        this.finished = true;
        this.cancelBtn.hidden = true;
        this.eta.textContent = '';
      }
    }

    setStatus(text) {
      this.statusText.textContent = text;
    }

    setQueued(position) {
      if (this.card.dataset.state !== 'queued') return;
      this.setStatus(position > 0 ? 'Queued: ' + position + ' job(s) ahead' : 'Queued: next in line');
    }

    onEvent(type, d) {
      if (this.finished) return;
      switch (type) {
        case 'queued':  // the event carries no position: the 202 answer and the polling give it
          if (d.queue_position !== undefined) this.setQueued(d.queue_position);
          return;
        case 'started':
          this.setState('running');
          this.setStatus('Running on ' + (d.device || 'a device') + (d.attempt > 1 ? ' (attempt ' + d.attempt + ')' : ''));
          return;
        case 'step': return this.onStep(d);
        case 'preview':
          this.preview.src = 'data:image/jpeg;base64,' + d.image;
          this.preview.hidden = false;
          return;
        case 'requeued':
          this.setState('queued');
          this.setStatus('Its device failed: it runs again on another one');
          return;
        case 'done':
          this.finished = true;  // the result is fetched once, whether the stream or the polling saw the end
          return this.fetchResult();
        case 'failed':
          this.setState('failed');
          this.setStatus('Failed: ' + (d.error || 'unknown error'));
          return;
        case 'cancelled':
          this.setState('cancelled');
          this.setStatus('Cancelled' + (d.reason ? ' (' + d.reason + ')' : ''));
          return;
      }
    }

    onStep(d) {
      if (this.card.dataset.state !== 'running') this.setState('running');
      const total = d.total_steps || 1;
      this.bar.value = d.progress !== undefined ? d.progress : d.step / total;
      if (!this.cancelBtn.disabled) this.setStatus('Step ' + d.step + ' of ' + total);  // else it says 'Cancelling…'
      const now = performance.now();
      if (!this.firstStep) this.firstStep = {step: d.step, t: now};
      const done = d.step - this.firstStep.step;
      // Events that arrive in one network chunk are handled within a millisecond: no rate from those.
      if (done > 0 && now - this.firstStep.t >= MIN_ETA_SPAN_MS) {
        const perStep = (now - this.firstStep.t) / done;
        const left = Math.max(0, Math.round(((total - d.step) * perStep) / 1000));
        this.eta.textContent = 'about ' + left + ' s left';
      }
    }

    async fetchResult() {
      try {
        const job = await A.request('GET', '/v1/jobs/' + this.id);
        this.finish(job);
      } catch (err) {
        A.showError(err);
        this.setState('failed');
        this.setStatus('Finished, but the result could not be fetched: ' + err.message);
      }
    }

    // job: the GET /v1/jobs/{id} document of a finished job.
    finish(job) {
      if (job.state !== 'done') return this.onEvent(job.state, {error: job.error, reason: job.error});
      this.bar.value = 1;
      this.setState('done');
      const n = (job.images || []).length;
      this.setStatus('Done: ' + n + ' image' + (n === 1 ? '' : 's') +
                                (job.elapsed_s ? ' in ' + job.elapsed_s.toFixed(1) + ' s' : ''));
      if (n) {
        A.form.setLastSeed(job.images[0].seed);
        const first = job.images[0];
        this.preview.src = 'data:image/' + (first.format || 'png') + ';base64,' + first.data;  // the result itself
        this.preview.hidden = false;
      }
      A.gallery.addJob(job, this.params);
    }

    async cancel() {
      this.cancelBtn.disabled = true;
      this.setStatus('Cancelling…');
      try {
        await A.request('DELETE', '/v1/jobs/' + this.id);
      } catch (err) {
        this.cancelBtn.disabled = false;
        A.showError(err);
      }
    }

    // Follows the event stream (when fewer than options.maxStreams are open); without one, or when it breaks
    // before the job ends, polls instead.
    async follow() {
      if (openStreams < options.maxStreams) {
        ++openStreams;
        const poller = setInterval(() => this.pollQueuePosition(), QUEUE_POLL_MS);
        try {
          await A.followEvents('/v1/jobs/' + this.id + '/events', (type, d) => this.onEvent(type, d));
        } catch (err) {
          if (!this.finished) A.showError(err);
        } finally {
          clearInterval(poller);
          --openStreams;
        }
      }
      while (!this.finished) {
        await new Promise((r) => setTimeout(r, FALLBACK_POLL_MS));
        try {
          const job = await A.request('GET', '/v1/jobs/' + this.id + '?images=0');
          if (TERMINAL.includes(job.state)) await this.fetchResult();
          else if (job.state === 'queued') this.setQueued(job.queue_position || 0);
          else if (job.total_steps) this.onStep({step: job.step, total_steps: job.total_steps, progress: job.progress});
        } catch (err) {
          A.showError(err);
          if (err.status === 404) {  // the server forgot the job (restarted, or kept it too long)
            this.setState('failed');
            this.setStatus('The server no longer knows this job.');
          }
        }
      }
    }

    async pollQueuePosition() {
      if (this.card.dataset.state !== 'queued') return;
      try {
        const job = await A.request('GET', '/v1/jobs/' + this.id + '?images=0');
        if (job.state === 'queued') this.setQueued(job.queue_position || 0);
      } catch (err) { /* the event stream reports failures */ }
    }
  }

  let openStreams = 0;

  function trimFinished() {
    const list = document.getElementById('jobs');
    const finished = Array.from(list.children).filter((c) => TERMINAL.includes(c.dataset.state));
    for (const c of finished.slice(MAX_FINISHED_CARDS)) c.remove();
    document.getElementById('jobs-empty').hidden = list.children.length > 0;
  }

  // Submits one job; throws ApiError when the server refuses it (shown by the caller).
  async function submit(body) {
    const answer = await A.request('POST', '/v1/jobs', body);
    const params = Object.assign({}, body);
    const view = new JobView(answer.id, params, answer.queue_position || 0);
    const list = document.getElementById('jobs');
    list.insertBefore(view.card, list.firstChild);
    trimFinished();
    // On a phone the jobs are below the long form: bring the new card into view.
    if (window.matchMedia(NARROW_SCREEN).matches) view.card.scrollIntoView({behavior: 'smooth', block: 'nearest'});
    view.follow().finally(trimFinished);
    return view;
  }

  A.jobs = {submit: submit, options: options};
})(window.Atelier = window.Atelier || {});
