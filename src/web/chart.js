// Small charts drawn on <canvas> (no library): a line over the last N readings, and bars for a histogram.
// The canvas is sized to its box and the screen's pixel ratio on every draw, so it stays sharp on a phone.
'use strict';
(function (A) {
  const HISTORY = 90;          // readings kept per line chart (at one reading per poll)
  const LINE = '#2f6fdf';
  const FILL = 'rgba(47, 111, 223, 0.15)';
  const GRID = 'rgba(127, 127, 127, 0.35)';
  const LABEL = '#808080';

  function fitCanvas(canvas) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(1, Math.round(canvas.clientWidth * dpr));
    const h = Math.max(1, Math.round(canvas.clientHeight * dpr));
    if (canvas.width !== w || canvas.height !== h) {
      canvas.width = w;
      canvas.height = h;
    }
    const ctx = canvas.getContext('2d');
    ctx.clearRect(0, 0, w, h);
    return {ctx: ctx, w: w, h: h, dpr: dpr};
  }

  // A value over time. `max`: a fixed top of the scale (e.g. 1 for ratios), else the largest value seen.
  class LineChart {
    constructor(canvas, options) {
      this.canvas = canvas;
      this.max = options && options.max;
      this.values = [];
    }
    push(v) {
      this.values.push(Number.isFinite(v) ? v : 0);
      if (this.values.length > HISTORY) this.values.shift();
      this.draw();
    }
    draw() {
      const {ctx, w, h, dpr} = fitCanvas(this.canvas);
      const top = this.max || Math.max(1e-9, ...this.values) * 1.1;
      ctx.strokeStyle = GRID;
      ctx.lineWidth = dpr;
      ctx.beginPath();
      ctx.moveTo(0, h - dpr / 2);
      ctx.lineTo(w, h - dpr / 2);
      ctx.stroke();
      if (this.values.length < 2) return;
      const x = (i) => (i / (HISTORY - 1)) * w + (HISTORY - this.values.length) * w / (HISTORY - 1);
      const y = (v) => h - Math.min(1, v / top) * (h - 2 * dpr) - dpr;
      ctx.beginPath();
      this.values.forEach((v, i) => (i ? ctx.lineTo(x(i), y(v)) : ctx.moveTo(x(i), y(v))));
      ctx.strokeStyle = LINE;
      ctx.lineWidth = 1.5 * dpr;
      ctx.stroke();
      ctx.lineTo(x(this.values.length - 1), h);
      ctx.lineTo(x(0), h);
      ctx.closePath();
      ctx.fillStyle = FILL;
      ctx.fill();
    }
  }

  // Bars: [{label, value}] scaled to the largest, labels under the bars when there is room.
  function drawBars(canvas, bars) {
    const {ctx, w, h, dpr} = fitCanvas(canvas);
    if (!bars.length) return;
    const labelH = 12 * dpr;
    const top = Math.max(1, ...bars.map((b) => b.value));
    const slot = w / bars.length;
    ctx.font = (10 * dpr) + 'px sans-serif';
    ctx.textAlign = 'center';
    // Labels only where they fit, else every other one (and so on), so that they never overlap.
    const widest = Math.max(...bars.map((b) => ctx.measureText(b.label).width));
    const every = Math.max(1, Math.ceil((widest + 4 * dpr) / slot));
    bars.forEach((b, i) => {
      const bh = (b.value / top) * (h - labelH - 2 * dpr);
      ctx.fillStyle = LINE;
      ctx.fillRect(i * slot + slot * 0.15, h - labelH - bh, slot * 0.7, bh);
      ctx.fillStyle = LABEL;
      if (i % every === 0) ctx.fillText(b.label, i * slot + slot / 2, h - 2 * dpr);
    });
  }

  A.LineChart = LineChart;
  A.drawBars = drawBars;
})(window.Atelier = window.Atelier || {});
