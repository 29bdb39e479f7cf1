// Painting an inpainting mask over the start image: strokes drawn with the pointer (mouse, pen or touch) on a
// canvas that shows the image, kept in the image's own pixels so the mask has the image's size whatever size the
// canvas is shown at. mask() gives the mask as a PNG data URL (white strokes on black: what to repaint), or null
// when nothing is painted.
'use strict';
(function (A) {
  const $ = (id) => document.getElementById(id);
  const STROKE_COLOUR = 'rgba(255, 64, 64, 0.55)';  // the painted area over the image, seen through

  let image = null;   // the start image (an HTMLImageElement, loaded), or null
  let strokes = [];   // [{radius, points: [[x, y], ...]}] in image pixels
  let current = null; // the stroke being drawn

  // The canvas's pixels per image pixel (the canvas is drawn at its shown size).
  function scale() {
    return $('mask-canvas').width / image.naturalWidth;
  }

  function drawStroke(ctx, s, k) {
    ctx.lineWidth = 2 * s.radius * k;
    ctx.lineCap = ctx.lineJoin = 'round';
    ctx.beginPath();
    s.points.forEach(([x, y], i) => (i ? ctx.lineTo(x * k, y * k) : ctx.moveTo(x * k, y * k)));
    if (s.points.length === 1) ctx.lineTo(s.points[0][0] * k + 0.01, s.points[0][1] * k);  // a dot
    ctx.stroke();
  }

  function render() {
    const canvas = $('mask-canvas');
    if (!image) return;
    const width = canvas.getBoundingClientRect().width;  // 0 while hidden: the image's own size until shown
    const shown = width > 0 ? Math.round(width) : image.naturalWidth;
    canvas.width = shown;
    canvas.height = Math.max(1, Math.round(shown * image.naturalHeight / image.naturalWidth));
    const ctx = canvas.getContext('2d');
    ctx.drawImage(image, 0, 0, canvas.width, canvas.height);
    ctx.strokeStyle = STROKE_COLOUR;
    const k = scale();
    for (const s of strokes) drawStroke(ctx, s, k);
    $('mask-paint-clear').disabled = strokes.length === 0;
  }

  // A pointer event -> its position in image pixels.
  function at(e) {
    const r = $('mask-canvas').getBoundingClientRect();
    return [(e.clientX - r.left) * image.naturalWidth / r.width, (e.clientY - r.top) * image.naturalHeight / r.height];
  }

  function brushRadius() {
    const v = Number($('mask-brush').value);
    return Number.isFinite(v) && v > 0 ? v / 2 : 16;
  }

  function init() {
    const canvas = $('mask-canvas');
    canvas.addEventListener('pointerdown', (e) => {
      if (!image) return;
      e.preventDefault();
      canvas.setPointerCapture(e.pointerId);
      current = {radius: brushRadius(), points: [at(e)]};
      strokes.push(current);
      render();
    });
    canvas.addEventListener('pointermove', (e) => {
      if (!current) return;
      current.points.push(at(e));
      render();
    });
    const end = () => { current = null; };
    canvas.addEventListener('pointerup', end);
    canvas.addEventListener('pointercancel', end);
    $('mask-paint-clear').addEventListener('click', () => {
      strokes = [];
      render();
    });
    window.addEventListener('resize', render);
  }

  // The start image changed (a data URL, or null): painting starts over on it. (The form shows or hides the canvas.)
  function setImage(dataUrl) {
    strokes = [];
    current = null;
    if (!dataUrl) {
      image = null;
      return;
    }
    const img = new Image();
    img.onload = () => {
      image = img;
      render();
    };
    img.src = dataUrl;
  }

  // The painted mask at the image's size as a PNG data URL, or null when nothing is painted.
  function mask() {
    if (!image || strokes.length === 0) return null;
    const c = document.createElement('canvas');
    c.width = image.naturalWidth;
    c.height = image.naturalHeight;
    const ctx = c.getContext('2d');
    ctx.fillStyle = '#000';
    ctx.fillRect(0, 0, c.width, c.height);
    ctx.strokeStyle = '#fff';
    for (const s of strokes) drawStroke(ctx, s, 1);
    return c.toDataURL('image/png');
  }

  A.maskPainter = {init, setImage, mask, render, strokeCount: () => strokes.length};
})(window.Atelier = window.Atelier || {});
