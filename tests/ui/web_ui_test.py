#!/usr/bin/python3
"""End-to-end test of the web UI: a real headless Chromium (Debian's chromium + chromium-driver, driven by
python3-selenium) against a real `atelier serve` with the sd15-tiny model.

Checks: the page loads with every control labelled; an image generated through the form (Ctrl+Enter) appears
in the gallery with a PNG that carries its parameters; the progress bar takes intermediate values with a live
preview and an ETA; a running job is cancelled from its card; "Reuse" fills the form with a gallery entry's
parameters; a 400 (width 100), a 429 (full queue) and a 401 (API key) show readable messages; the dashboard
says it has no GPU metrics on a CPU worker; the layout fits 375 px; a stopped server shows "Server
unreachable"; with the flux-tiny fixture served beside it, a FLUX model's CFG field reads "Guidance" and is sent
as FLUX's distilled guidance, and a start image runs FLUX img2img. Screenshots of each check go to --artifacts.

Run by ctest (label `ui`); exits 77 (SKIP_RETURN_CODE) with the reason when chromium, chromedriver,
selenium or the fixture is missing, 1 when a check fails.
"""
import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
import struct
import zlib

SKIP = 77
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 60  # upper bound for anything the tiny model does on a loaded 2-core machine


def skip(reason):
    print("SKIPPED: " + reason, flush=True)
    sys.exit(SKIP)


try:
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait
    from selenium.webdriver.common.action_chains import ActionChains
except ImportError as e:  # checked before anything else: the test cannot run at all
    skip("python3-selenium is not installed for /usr/bin/python3 (%s); scripts/setup.sh installs it" % e)


class AtelierServer:
    """`atelier serve` on a free port; `url` once it prints its listening line."""

    def __init__(self, binary, model, extra_args=()):
        args = [binary, "serve", "--model", "tiny=" + model, "--port", "0", "--cpu-threads", "1"] + list(extra_args)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.url = None
        self.log = []
        found = threading.Event()

        def read():
            for line in self.proc.stdout:
                self.log.append(line)
                if line.startswith("listening on ") and not found.is_set():
                    self.url = line.split("listening on ", 1)[1].strip()
                    found.set()
            found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(WAIT_S) or not self.url:
            self.stop()
            raise RuntimeError("atelier serve did not start: " + "".join(self.log)[-2000:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class UiTest:
    def __init__(self, driver, artifacts):
        self.d = driver
        self.artifacts = artifacts
        self.failures = []

    # --- helpers ---
    def shot(self, name):
        self.d.save_screenshot(os.path.join(self.artifacts, name + ".png"))

    def wait(self, what, cond, timeout=WAIT_S):
        try:
            return WebDriverWait(self.d, timeout, poll_frequency=0.05).until(lambda d: cond())
        except Exception:
            raise AssertionError("timed out after %d s waiting for %s" % (timeout, what))

    def js(self, script, *args):
        return self.d.execute_script(script, *args)

    def el(self, css):
        return self.d.find_element(By.CSS_SELECTOR, css)

    def set_value(self, element_id, value):
        e = self.el("#" + element_id)
        e.clear()
        if value != "":
            e.send_keys(str(value))
        self.js("arguments[0].dispatchEvent(new Event('change', {bubbles: true}))", e)

    def alert_text(self):
        return self.js("return document.getElementById('alert').hidden ? ''"
                       " : document.getElementById('alert-text').textContent.trim();")

    def wait_alert(self, *needles):
        def has():
            t = self.alert_text().lower()
            return all(n.lower() in t for n in needles)
        try:
            self.wait("an alert saying " + repr(needles), has, 30)
        except AssertionError:
            raise AssertionError("no alert with %r; alert is %r" % (needles, self.alert_text()))
        return self.alert_text()

    def form_for_job(self, prompt, steps, seed=None, preview=True):
        self.set_value("prompt", prompt)
        self.set_value("steps", steps)
        self.set_value("width", "")
        self.set_value("height", "")
        Select(self.el("#seed-mode")).select_by_value("fixed" if seed is not None else "random")
        if seed is not None:
            self.set_value("seed", seed)
        if self.el("#preview").is_selected() != preview:
            self.el("#preview").click()

    def job_ids(self):
        return self.js("return Array.from(document.querySelectorAll('#jobs .job')).map((j) => j.dataset.jobId)")

    def submit_job(self):
        """Clicks Generate; returns the id of the job card that appears for it."""
        before = set(self.job_ids())
        self.el("#generate-btn").click()
        return self.wait("a new job card", lambda: next((i for i in self.job_ids() if i not in before), None))

    def job_state(self, job_id):
        return self.js("const j = document.querySelector('.job[data-job-id=\"' + arguments[0] + '\"]');"
                       "return j ? j.dataset.state : null;", job_id)

    def wait_job_state(self, job_id, states, timeout=WAIT_S):
        try:
            self.wait("job %s to be %s" % (job_id[:8], states), lambda: self.job_state(job_id) in states, timeout)
        except AssertionError as e:  # what the card and the alert say makes the failure readable
            card = ".job[data-job-id='%s'] .job-status" % job_id
            raise AssertionError("%s; the card is %r, saying %r; alert %r" % (
                e, self.job_state(job_id), self.el(card).text, self.alert_text()))

    def run(self, name, check):
        print("--- " + name, flush=True)
        try:
            check()
            print("    ok", flush=True)
        except Exception as e:
            self.failures.append(name)
            print("    FAILED: %s" % e, flush=True)
            traceback.print_exc()
        finally:
            try:
                self.shot(name)
            except WebDriverException:
                pass

    # --- checks ---
    def check_page_loads(self, url):
        self.d.get(url)
        self.wait("the model list", lambda: self.js("return document.querySelector('#model option[value=\"tiny\"]') !== null"))
        self.wait("the sampler list", lambda: self.js("return document.querySelectorAll('#sampler option').length > 3"))
        assert self.alert_text() == "", "unexpected alert: " + self.alert_text()
        unlabelled = self.js("""
            return Array.from(document.querySelectorAll('input, select, textarea'))
              .filter((e) => !e.labels || e.labels.length === 0).map((e) => e.id || e.outerHTML.slice(0, 60));""")
        assert not unlabelled, "controls without a <label>: %s" % unlabelled

    def check_generate(self):
        self.form_for_job("a red cube", 4, seed=1234)
        self.el("#prompt").send_keys(Keys.CONTROL, Keys.ENTER)  # the keyboard path
        item = ".gallery-item[data-seed='1234'] img"
        self.wait("the image in the gallery", lambda: self.js(
            "const i = document.querySelector(arguments[0]); return i !== null && i.complete && i.naturalWidth > 0;", item))
        href = self.el(".gallery-item[data-seed='1234'] a.download").get_attribute("href")
        prefix = "data:image/png;base64,"
        assert href.startswith(prefix), "download link is not a PNG: " + href[:40]
        png = base64.b64decode(href[len(prefix):])
        assert png[:8] == b"\x89PNG\r\n\x1a\n", "download bytes are not a PNG"
        assert b"parameters" in png and b"a red cube" in png, "the PNG lacks its A1111 parameters infotext"
        width = self.js("return document.querySelector(arguments[0]).naturalWidth", item)
        assert width == 128, "expected the tiny model's 128 px image, got %s" % width

    def check_progress(self):
        # Records every value the progress bar and ETA take, as the page sets them.
        self.js("""
            window.__progress = []; window.__eta = []; window.__previews = 0; window.__cancelAt = [];
            const before = new Set(Array.from(document.querySelectorAll('#jobs .job')).map((j) => j.dataset.jobId));
            new MutationObserver(() => {  // the card of the job submitted next
              const j = Array.from(document.querySelectorAll('#jobs .job')).find((c) => !before.has(c.dataset.jobId));
              if (!j) return;
              const v = j.querySelector('progress').value, last = window.__progress[window.__progress.length - 1];
              if (v !== last) window.__progress.push(v);
              const eta = j.querySelector('.job-eta').textContent;
              if (eta) window.__eta.push(eta);
              if ((j.querySelector('.job-preview').src || '').startsWith('data:image/jpeg')) window.__previews++;
              // Where the Cancel button sits in its card while it shows (a button that moves is a click that misses).
              const b = j.querySelector('.job-cancel'), br = b.getBoundingClientRect(), cr = j.getBoundingClientRect();
              const at = Math.round(br.x - cr.x) + ',' + Math.round(br.y - cr.y);
              if (!b.hidden && !window.__cancelAt.includes(at)) window.__cancelAt.push(at);
            }).observe(document.getElementById('jobs'), {subtree: true, attributes: true, childList: true, characterData: true});""")
        self.form_for_job("progress please", 60, seed=7)
        job = self.submit_job()
        self.wait("a progress value between 0 and 1", lambda: self.js(
            "return window.__progress.some((v) => v > 0 && v < 1)"))
        self.shot("progress_running")
        self.wait_job_state(job, ["done"])
        values = self.js("return window.__progress")
        intermediate = sorted({v for v in values if 0 < v < 1})
        print("    progress values seen: %d intermediate (%s ...)" % (len(intermediate), intermediate[:5]))
        assert len(intermediate) >= 2, "the progress bar took fewer than two intermediate values: %s" % values
        assert values == sorted(values), "the progress bar went backwards: %s" % values
        assert self.js("return window.__eta.some((t) => /\\d+ s left/.test(t))"), "no ETA was shown"
        assert self.js("return window.__previews") > 0, "no live preview was shown"
        moves = self.js("return window.__cancelAt")
        assert len(moves) == 1, "the Cancel button moved within its card while the job ran: %s" % moves

    def check_cancel(self):
        self.form_for_job("cancel me", 150)
        job = self.submit_job()
        self.wait_job_state(job, ["running"])
        self.el(".job[data-job-id='%s'] .job-cancel" % job).click()
        self.wait_job_state(job, ["cancelled"])
        status = self.el(".job[data-job-id='%s'] .job-status" % job).text
        assert "Cancelled" in status, "status after cancel: " + status

    def check_reuse(self):
        self.form_for_job("something else", 9)
        self.set_value("cfg_scale", 3)
        self.el(".gallery-item[data-seed='1234'] button.reuse").click()
        got = {k: self.el("#" + k).get_attribute("value") for k in ("prompt", "steps", "seed", "cfg_scale", "sampler")}
        got["seed-mode"] = Select(self.el("#seed-mode")).first_selected_option.get_attribute("value")
        want = {"prompt": "a red cube", "steps": "4", "seed": "1234", "cfg_scale": "7", "seed-mode": "fixed"}
        for k, v in want.items():
            assert got[k] == v, "after Reuse, %s is %r, expected %r (form: %s)" % (k, got[k], v, got)

    def check_img2img(self):
        href = self.el(".gallery-item[data-seed='1234'] a.download").get_attribute("href")
        start = os.path.abspath(os.path.join(self.artifacts, "img2img_start.png"))
        with open(start, "wb") as f:
            f.write(base64.b64decode(href.split(",", 1)[1]))
        self.form_for_job("img2img", 8, seed=99)
        self.set_value("strength", 0.5)
        self.el("#init_image").send_keys(start)
        self.wait("the start image preview", lambda: self.el("#init-preview").is_displayed())
        self.js("Atelier.jobs.options.maxStreams = 0")  # this job is polled: the path past 3 concurrent jobs
        try:
            job = self.submit_job()
            self.wait_job_state(job, ["done", "failed", "cancelled"])
        finally:
            self.js("Atelier.jobs.options.maxStreams = 3")
        assert self.job_state(job) == "done", "img2img job: " + self.el(".job[data-job-id='%s'] .job-status" % job).text
        self.wait("the img2img result in the gallery", lambda: self.d.find_elements(
            By.CSS_SELECTOR, ".gallery-item[data-job-id='%s']" % job))
        self.el("#init-clear").click()
        assert not self.el("#init-preview").is_displayed(), "the start image was not removed"

    def check_inpaint(self, url):
        # The img2img start image again with a mask of its size (white left half): an SD inpainting whose right half
        # comes back as the start image's, with the mask's settings in its infotext.
        start = os.path.abspath(os.path.join(self.artifacts, "img2img_start.png"))
        with open(start, "rb") as f:
            width, height = struct.unpack(">II", f.read()[16:24])
        mask = os.path.abspath(os.path.join(self.artifacts, "inpaint_mask.png"))
        write_gray_png(mask, width, height, lambda x, y: 255 if x < width // 2 else 0)
        assert self.el("#mask_image").is_displayed(), "no mask field for an SD model"
        self.form_for_job("inpaint", 4, seed=5)
        self.el("#init_image").send_keys(start)
        self.el("#mask_image").send_keys(mask)
        self.wait("the mask preview", lambda: self.el("#mask-preview").is_displayed())
        self.set_value("mask_blur", 2)
        Select(self.el("#inpaint_fill")).select_by_value("latent_noise")
        job_id = self.submit_job()
        self.wait_job_state(job_id, ("done", "failed"))
        with urllib.request.urlopen(url + "/v1/jobs/" + job_id) as r:
            info = json.load(r)["images"][0]["infotext"]
        assert "Mask blur: 2" in info and "Masked content: latent noise" in info, "infotext: " + info
        self.el("#mask-clear").click()
        assert not self.el("#mask-preview").is_displayed(), "the mask was not removed"
        # Painted instead: a stroke across the start image on its canvas becomes a mask of the image's size.
        canvas = self.el("#mask-canvas")
        assert canvas.is_displayed(), "no canvas to paint the mask on"
        w = canvas.size["width"]
        ActionChains(self.d).move_to_element_with_offset(canvas, -w // 3, -w // 4).click_and_hold() \
            .move_by_offset(w // 3, 0).move_by_offset(w // 3, 0).release().perform()
        assert self.js("return Atelier.maskPainter.strokeCount()") == 1, "the stroke was not recorded"
        self.shot("inpaint_painted")
        job_id = self.submit_job()
        self.wait_job_state(job_id, ("done", "failed"))
        with urllib.request.urlopen(url + "/v1/jobs/" + job_id) as r:
            info = json.load(r)["images"][0]["infotext"]
        assert "Mask blur: 2" in info, "the painted mask was not sent: " + info
        self.el("#mask-paint-clear").click()
        assert self.js("return Atelier.maskPainter.mask()") is None, "the painting was not cleared"
        button = self.el("#init-clear")  # in the middle of the view: the page's alert bar covers its top
        self.js("arguments[0].scrollIntoView({block: 'center'})", button)
        button.click()
        assert not self.el("#mask-canvas").is_displayed(), "the canvas stays without a start image"

    def check_bad_request(self):
        self.form_for_job("bad size", 4)
        self.set_value("width", 100)
        self.el("#generate-btn").click()
        text = self.wait_alert("rejected", "width")
        print("    alert: " + text)
        self.set_value("width", "")

    def check_dashboard(self):
        self.d.execute_script("document.getElementById('dashboard').scrollIntoView()")
        self.wait("the CPU notice", lambda: self.el("#gpu-none").is_displayed())
        assert self.el("#gpu-none").text == "no GPU metrics (CPU worker)"
        self.wait("batch-size figures", lambda: "mean" in self.el("#stat-batch").text)
        self.wait("a worker tile", lambda: len(self.d.find_elements(By.CSS_SELECTOR, "#workers .tile")) == 1)
        ipm = float(self.el("#stat-ipm").text)
        assert ipm > 0, "images/min is %s after generating images" % ipm
        # A GPU server's figures (NVML gauges per device), fed to the same rendering code.
        gib = 1 << 30
        gauge = lambda v: {"series": [{"labels": {"device": "cuda:0"}, "value": v}]}
        fake = {"queue": {"depth": 2, "capacity": 64}, "workers": [], "metrics": {
            "atelier_gpu_utilization_ratio": gauge(0.87), "atelier_gpu_memory_used_bytes": gauge(30 * gib),
            "atelier_gpu_memory_total_bytes": gauge(141 * gib), "atelier_gpu_temperature_celsius": gauge(61),
            "atelier_gpu_power_watts": gauge(455)}}
        texts = self.js("Atelier.dashboard.render(arguments[0]);"
                        "return [document.getElementById('gpu-none').hidden,"
                        " Array.from(document.querySelectorAll('#gpus [data-device=\"cuda:0\"] .tile-value'))"
                        "   .map((e) => e.textContent)];", fake)
        self.shot("dashboard_gpu")
        assert texts[0], "the 'no GPU metrics' notice is shown next to GPU figures"
        assert texts[1] == ["87 %", "30.0 / 141 GiB", "61 °C", "455 W"], "GPU tiles: %s" % texts[1]

    def check_queue_full(self):
        self.form_for_job("fill the queue", 150)
        # Three submissions at once: one runs (--max-batch 1), one waits (--max-queue 1), the third is refused.
        self.js("for (let i = 0; i < 3; ++i) document.getElementById('generate-btn').click();")
        text = self.wait_alert("queue is full", "try again in")
        print("    alert: " + text)
        self.wait("a job card showing its queue position", lambda: self.js(
            "return Array.from(document.querySelectorAll('.job[data-state=\"queued\"] .job-status'))"
            ".some((s) => /^Queued: (next in line|\\d+ job)/.test(s.textContent))"))
        self.shot("queue_full_alert")
        # Each visible Cancel button clicked in the page, again until every job has ended: a click re-renders the job
        # cards, so buttons found before it may be gone (stale) by the time they would be clicked from here.
        self.wait("every job to end", lambda: self.js(
            "document.querySelectorAll('.job-cancel').forEach((b) => {"
            "  if (b.offsetParent !== null && !b.dataset.clicked) { b.dataset.clicked = '1'; b.click(); } });"
            "return Array.from(document.querySelectorAll('.job'))"
            "  .every((j) => ['done', 'failed', 'cancelled'].includes(j.dataset.state))"))

    def check_flux_guidance(self, url):
        Select(self.el("#model")).select_by_value("flux")
        self.wait("the Guidance label", lambda: self.el("#cfg-label").text == "Guidance")
        # Flow-matching Euler: no sampler, schedule or CLIP skip to choose; a start image (FLUX img2img) is.
        for css in ("#sampler", "#schedule", "#clip_skip", "#mask_blur", "#inpaint_fill"):
            assert not self.el(css).is_displayed(), css + " is shown for a FLUX model"
        assert self.el("#mask_image").is_displayed(), "no mask field for a FLUX model (FLUX inpaints)"
        assert self.el("fieldset.img2img").is_displayed(), "no start image field for a FLUX model"
        self.form_for_job("a blue fox", 2, seed=77, preview=False)
        self.set_value("width", 64)
        self.set_value("height", 64)
        self.set_value("cfg_scale", 2.5)
        job_id = self.submit_job()
        self.wait_job_state(job_id, ("done",))
        with urllib.request.urlopen(url + "/v1/jobs/" + job_id) as r:
            info = json.load(r)["images"][0]["infotext"]
        # The field went out as "guidance": no true CFG (CFG scale 1), the distilled guidance 2.5.
        assert "Distilled CFG Scale: 2.5" in info and "CFG scale: 1," in info, "infotext: " + info
        # The same with a start image (check_img2img's): FLUX img2img at the chosen strength.
        self.set_value("strength", 0.5)
        self.el("#init_image").send_keys(os.path.abspath(os.path.join(self.artifacts, "img2img_start.png")))
        self.wait("the start image preview", lambda: self.el("#init-preview").is_displayed())
        job_id = self.submit_job()
        self.wait_job_state(job_id, ("done",))
        with urllib.request.urlopen(url + "/v1/jobs/" + job_id) as r:
            info = json.load(r)["images"][0]["infotext"]
        assert "Denoising strength: 0.5" in info and "Distilled CFG Scale: 2.5" in info, "infotext: " + info
        # FLUX inpainting: a stroke painted over the start image; the job runs with the mask (a 400 otherwise would
        # fail it: the mask has the image's size).
        canvas = self.el("#mask-canvas")
        assert canvas.is_displayed(), "no canvas to paint a FLUX mask on"
        ActionChains(self.d).move_to_element(canvas).click_and_hold().move_by_offset(20, 0).release().perform()
        assert self.js("return Atelier.form.values().mask !== undefined"), "the FLUX job would go without the mask"
        job_id = self.submit_job()
        self.wait_job_state(job_id, ("done",))
        self.el("#mask-paint-clear").click()
        button = self.el("#init-clear")
        self.js("arguments[0].scrollIntoView({block: 'center'})", button)
        button.click()
        Select(self.el("#model")).select_by_value("tiny")
        self.wait("the CFG scale label", lambda: self.el("#cfg-label").text == "CFG scale")
        for css in ("#sampler", "#schedule", "#clip_skip", "fieldset.img2img"):
            assert self.el(css).is_displayed(), css + " is hidden for an SD model"
        self.set_value("cfg_scale", 7)

    def check_phone_layout(self, url):
        # A phone's viewport through DevTools (a headless window cannot be made narrower than ~500 px).
        self.d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": 375, "height": 812, "deviceScaleFactor": 2, "mobile": True})
        self.d.get(url)
        width = self.js("return window.innerWidth")
        assert width == 375, "the emulated viewport is %s px wide, not 375" % width
        # The reload kept the last settings and the gallery.
        assert self.el("#prompt").get_attribute("value") == "fill the queue", "the last prompt was not remembered"
        assert self.el("#steps").get_attribute("value") == "150", "the last steps were not remembered"
        self.wait("the stored gallery", lambda: len(self.d.find_elements(By.CSS_SELECTOR, ".gallery-item")) >= 3)
        self.wait("the model list", lambda: self.js("return document.querySelector('#model option') !== null"))
        overflow = self.js("return document.documentElement.scrollWidth")
        assert overflow <= 375, "the page is %d px wide at a 375 px viewport (horizontal scrolling)" % overflow
        assert self.el("#generate-btn").is_displayed()
        self.shot("phone_layout_375px")
        self.d.execute_script("document.getElementById('gallery-section').scrollIntoView()")
        self.shot("phone_layout_375px_gallery")
        self.d.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

    def check_api_key(self, url):
        self.d.get(url)
        self.wait_alert("needs an API key", 'enter it under "API key"')
        self.el(".key summary").click()
        self.set_value("api-key", "s3cret")
        self.el("#key-save").click()
        self.wait("the model list after the key", lambda: self.js(
            "return document.querySelector('#model option[value=\"tiny\"]') !== null"))

    def check_http(self, url):
        """The files themselves (no browser): public under --api-key, ETag + 304, JSON 404s; the API is not public."""
        def get(path, headers=None):
            try:
                with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers or {}), timeout=10) as r:
                    return r.status, dict(r.headers), r.read()
            except urllib.error.HTTPError as e:
                return e.code, dict(e.headers), e.read()
        status, headers, body = get("/")
        assert status == 200 and b'<form id="gen-form"' in body, "GET / -> %s" % status
        assert headers.get("Content-Type", "").startswith("text/html"), headers
        for name in ("app.css", "api.js", "chart.js", "form.js", "gallery.js", "jobs.js", "dashboard.js", "app.js"):
            status, headers, _ = get("/ui/" + name)
            assert status == 200, "GET /ui/%s -> %s" % (name, status)
            etag = headers.get("ETag")
            assert etag, "no ETag on /ui/" + name
            again, _, body = get("/ui/" + name, {"If-None-Match": etag})
            assert again == 304 and not body, "If-None-Match on /ui/%s -> %s" % (name, again)
        status, _, body = get("/ui/nope.js")
        assert status == 404 and b"nope.js" in body, "GET /ui/nope.js -> %s %r" % (status, body[:100])
        status, _, _ = get("/v1/models")
        assert status == 401, "GET /v1/models without the key -> %s (the API must stay protected)" % status

    def check_server_down(self, server):
        server.stop()
        self.el("#generate-btn").click()
        text = self.wait_alert("server unreachable")
        print("    alert: " + text)
        assert self.el("#gen-form").is_displayed(), "the form is gone after the server stopped"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--atelier", required=True, help="the atelier binary")
    ap.add_argument("--fixtures", default="", help="fixtures root ($ATELIER_FIXTURES wins)")
    ap.add_argument("--artifacts", required=True, help="folder for the screenshots")
    args = ap.parse_args()

    for path, what in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            skip("%s not found (%s); scripts/setup.sh installs it" % (path, what))
    fixtures = os.environ.get("ATELIER_FIXTURES") or args.fixtures
    model = os.path.join(fixtures, "sd15-tiny", "model")
    if not os.path.isdir(model):
        skip("fixture 'sd15-tiny' not found (looked in %r; set $ATELIER_FIXTURES)" % fixtures)
    if not os.access(args.atelier, os.X_OK):
        print("the atelier binary %r is missing" % args.atelier)
        return 1
    shutil.rmtree(args.artifacts, ignore_errors=True)
    os.makedirs(args.artifacts, exist_ok=True)

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(a)
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    except WebDriverException as e:
        skip("headless chromium could not start: %s" % str(e).splitlines()[0])

    # One CPU worker that takes one job at a time and a queue of one: a third concurrent job gets a 429.
    flux = os.path.join(fixtures, "flux-tiny", "model")
    flux_args = ["--model", "flux=" + flux] if os.path.isdir(flux) else []
    server = AtelierServer(args.atelier, model, ["--max-batch", "1", "--max-queue", "1"] + flux_args)
    keyed = None
    t = UiTest(driver, args.artifacts)
    try:
        t.run("page_loads", lambda: t.check_page_loads(server.url))
        t.run("generate", t.check_generate)
        t.run("progress", t.check_progress)
        t.run("dashboard", t.check_dashboard)  # soon after the images: images/min is over the last minute
        t.run("cancel", t.check_cancel)
        t.run("reuse", t.check_reuse)
        t.run("img2img", t.check_img2img)
        t.run("inpaint", lambda: t.check_inpaint(server.url))
        t.run("bad_request", t.check_bad_request)
        t.run("queue_full", t.check_queue_full)
        t.run("phone_layout", lambda: t.check_phone_layout(server.url))
        if flux_args:
            t.run("flux_guidance", lambda: t.check_flux_guidance(server.url))
        else:
            print("--- flux_guidance: skipped, fixture 'flux-tiny' not found in %r" % fixtures)
        keyed = AtelierServer(args.atelier, model, ["--api-key", "s3cret"])
        t.run("http_files", lambda: t.check_http(keyed.url))
        t.run("api_key", lambda: t.check_api_key(keyed.url))
        t.run("server_down", lambda: t.check_server_down(keyed))
    finally:
        driver.quit()
        server.stop()
        if keyed:
            keyed.stop()
    print("screenshots: " + args.artifacts)
    if t.failures:
        print("FAILED checks: " + ", ".join(t.failures))
        return 1
    print("all web UI checks passed")
    return 0


def write_gray_png(path, width, height, value):
    """An 8-bit gray PNG whose pixel (x, y) is value(x, y): the standard library's zlib, no imaging package."""
    rows = b"".join(b"\x00" + bytes(value(x, y) for x in range(width)) for y in range(height))
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


if __name__ == "__main__":
    sys.exit(main())
