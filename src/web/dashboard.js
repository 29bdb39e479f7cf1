// The dashboard: polls GET /v1/stats and draws queue depth, images per minute, the batch-size histogram, each
// worker's busy share and, per GPU, utilization, memory, temperature and power. A CPU-only server has no
// NVML readings: the page says so instead of drawing empty charts.
'use strict';
(function (A) {
  const POLL_MS = 2000;
  const RATE_WINDOW_MS = 60000;  // images/min over the last minute (or since the page opened)
  const GIB = 1024 * 1024 * 1024;
  // Per GPU: metric, chart title, how to show the value, the scale's top (null = from the data).
  const GPU_CHARTS = [
    {metric: 'atelier_gpu_utilization_ratio', title: 'Utilization', show: (v) => Math.round(v * 100) + ' %', max: 1},
    {metric: 'atelier_gpu_memory_used_bytes', title: 'Memory', show: null, max: null},
    {metric: 'atelier_gpu_temperature_celsius', title: 'Temperature', show: (v) => Math.round(v) + ' °C', max: 100},
    {metric: 'atelier_gpu_power_watts', title: 'Power', show: (v) => Math.round(v) + ' W', max: null},
  ];

  const $ = (id) => document.getElementById(id);
  const charts = {};          // key -> LineChart
  const imageCounts = [];     // [{t, count}] for images/min
  let timer = null;

  function series(stats, name) {
    const m = stats.metrics && stats.metrics[name];
    return m && Array.isArray(m.series) ? m.series : [];
  }

  function chart(key, canvas, max) {
    if (!charts[key]) charts[key] = new A.LineChart(canvas, {max: max});
    return charts[key];
  }

  function imagesPerMinute(stats) {
    const total = series(stats, 'atelier_images_total').reduce((s, x) => s + (x.value || 0), 0);
    const now = Date.now();
    imageCounts.push({t: now, count: total});
    while (imageCounts.length > 2 && now - imageCounts[1].t > RATE_WINDOW_MS) imageCounts.shift();
    const first = imageCounts[0];
    const minutes = (now - first.t) / 60000;
    // A counter only grows; a drop means the server restarted: no rate until the window refills.
    return minutes > 0 ? Math.max(0, (total - first.count) / minutes) : 0;
  }

  // The histogram's buckets are cumulative and keyed by upper bound (as text): back to per-bucket counts.
  function batchBars(stats) {
    const h = series(stats, 'atelier_batch_size')[0];
    if (!h || !h.buckets) return {bars: [], mean: 0, count: 0};
    const bounds = Object.keys(h.buckets).map(Number).sort((a, b) => a - b);
    let previous = 0;
    const bars = bounds.map((b) => {
      const cumulative = h.buckets[String(b)];
      const bar = {label: '≤' + b, value: cumulative - previous};
      previous = cumulative;
      return bar;
    });
    return {bars: bars, mean: h.mean || 0, count: h.count || 0};
  }

  function tile(container, key, title) {
    let t = container.querySelector('[data-key="' + key + '"]');
    if (t) return t;
    t = document.createElement('div');
    t.className = 'tile';
    t.dataset.key = key;
    const label = document.createElement('span');
    label.className = 'tile-label';
    label.textContent = title;
    const value = document.createElement('span');
    value.className = 'tile-value';
    const canvas = document.createElement('canvas');
    canvas.setAttribute('role', 'img');
    canvas.setAttribute('aria-label', title + ' over time');
    t.append(label, value, canvas);
    container.appendChild(t);
    return t;
  }

  function renderWorkers(stats) {
    const busy = series(stats, 'atelier_device_busy_ratio');
    for (const w of stats.workers || []) {
      const key = 'worker-' + w.index;
      const t = tile($('workers'), key, 'Worker ' + w.index + ' (' + w.device + ') busy');
      const b = busy.find((s) => s.labels && s.labels.worker === String(w.index));
      const ratio = b ? b.value : 0;
      t.querySelector('.tile-value').textContent = Math.round(ratio * 100) + ' %' + (w.healthy ? '' : ' — out of service') +
          ' · ' + w.load + '/' + w.max_batch + ' images';
      chart(key, t.querySelector('canvas'), 1).push(ratio);
    }
  }

  function renderGpus(stats) {
    const util = series(stats, 'atelier_gpu_utilization_ratio');
    $('gpu-none').hidden = util.length > 0;
    if (!util.length) return;
    const memTotal = series(stats, 'atelier_gpu_memory_total_bytes');
    for (const u of util) {
      const device = u.labels.device;
      let box = $('gpus').querySelector('[data-device="' + device + '"]');
      if (!box) {
        box = document.createElement('div');
        box.className = 'gpu tiles';
        box.dataset.device = device;
        const h = document.createElement('h4');
        h.textContent = device;
        box.appendChild(h);
        $('gpus').appendChild(box);
      }
      for (const c of GPU_CHARTS) {
        const s = series(stats, c.metric).find((x) => x.labels.device === device);
        if (!s) continue;
        const key = device + '-' + c.metric;
        const t = tile(box, key, c.title);
        let max = c.max, text;
        if (c.metric === 'atelier_gpu_memory_used_bytes') {
          const total = memTotal.find((x) => x.labels.device === device);
          max = total ? total.value : null;
          text = (s.value / GIB).toFixed(1) + (total ? ' / ' + (total.value / GIB).toFixed(0) : '') + ' GiB';
        } else {
          text = c.show(s.value);
        }
        t.querySelector('.tile-value').textContent = text;
        chart(key, t.querySelector('canvas'), max).push(s.value);
      }
    }
  }

  function render(stats) {
    const depth = stats.queue ? stats.queue.depth : 0;
    $('stat-queue').textContent = depth + (stats.queue ? ' / ' + stats.queue.capacity : '');
    chart('queue', $('chart-queue'), null).push(depth);
    const ipm = imagesPerMinute(stats);
    $('stat-ipm').textContent = ipm.toFixed(1);
    chart('ipm', $('chart-ipm'), null).push(ipm);
    const batch = batchBars(stats);
    $('stat-batch').textContent = batch.count ? 'mean ' + batch.mean.toFixed(2) + ' over ' + batch.count + ' calls' : 'no model call yet';
    A.drawBars($('chart-batch'), batch.bars);
    renderWorkers(stats);
    renderGpus(stats);
    $('stats-meta').textContent = 'Server ' + (stats.version || '') + ', up ' + Math.round(stats.uptime_s || 0) + ' s; ' +
        (stats.jobs_stored || 0) + ' jobs stored; updated ' + new Date().toLocaleTimeString() + '.';
  }

  async function poll() {
    timer = null;
    if (!document.hidden) {
      try {
        render(await A.request('GET', '/v1/stats'));
      } catch (err) {
        A.showError(err);
      }
    }
    timer = setTimeout(poll, POLL_MS);
  }

  function start() {
    if (timer === null) poll();
  }

  // render is exposed for the UI test, which feeds it GPU figures a CPU-only test machine cannot produce.
  A.dashboard = {start: start, render: render};
})(window.Atelier = window.Atelier || {});
