// The labelling page of `rlhf label`: shows a pair, sends the choice, shows the next one.
// Every text from the server is inserted with textContent (never as HTML): answers are model output.
"use strict";

(function () {
  // First visit: the name form remembers the last name used on this device.
  const form = document.getElementById("name-form");
  if (form) {
    const input = document.getElementById("labeller");
    const saved = window.localStorage.getItem("rlhf-labeller");
    if (saved && !input.value) input.value = saved;
    form.addEventListener("submit", () => window.localStorage.setItem("rlhf-labeller", input.value.trim()));
    return;
  }

  const labeller = document.body.dataset.labeller;
  const ratingsOn = document.body.dataset.ratings === "on";
  window.localStorage.setItem("rlhf-labeller", labeller);
  const $ = (id) => document.getElementById(id);
  let current = null; // {pair, shownAt, ratings: {a, b}}
  let last = null; // id of this labeller's latest saved label (for undo)
  let busy = false;

  function status(text, kind) {
    const el = $("status");
    el.textContent = text;
    el.className = "status " + (kind || "");
  }

  function showProgress(p) {
    last = p.last;
    let text = `${p.done} / ${p.total}`;
    if (p.mine) {
      text += ` · you: ${p.mine}`;
      if (p.seconds_per_label != null) text += `, ${p.seconds_per_label.toFixed(1)} s per label`;
    }
    $("progress").textContent = text;
    $("undo").disabled = !last;
    $("done-undo").disabled = !last;
  }

  // Text with ``` fences: code blocks in <pre><code>, the rest as paragraphs; all of it as plain text.
  function renderText(container, text) {
    container.replaceChildren();
    const parts = text.split(/```[^\n]*\n?/);
    parts.forEach((part, i) => {
      if (i % 2 === 1) {
        const pre = document.createElement("pre");
        const code = document.createElement("code");
        code.textContent = part.replace(/\n$/, "");
        pre.appendChild(code);
        container.appendChild(pre);
      } else if (part.trim() !== "") {
        const p = document.createElement("div");
        p.className = "para";
        p.textContent = part.replace(/^\n+|\n+$/g, "");
        container.appendChild(p);
      }
    });
    if (!text) {
      const empty = document.createElement("em");
      empty.textContent = "(empty answer)";
      container.appendChild(empty);
    }
  }

  function renderPrompt(prompt) {
    const box = $("prompt");
    box.replaceChildren();
    const messages = typeof prompt === "string" ? [{ role: "user", content: prompt }] : prompt;
    for (const message of messages) {
      const bubble = document.createElement("div");
      bubble.className = "message " + message.role;
      const role = document.createElement("div");
      role.className = "role";
      role.textContent = message.role;
      const body = document.createElement("div");
      renderText(body, message.content);
      bubble.append(role, body);
      box.appendChild(bubble);
    }
  }

  function side(which) {
    // "left"/"right" → the answer key ("a"/"b") shown there
    const left = current.pair.left;
    return which === "left" ? left : left === "a" ? "b" : "a";
  }

  function render(data) {
    showProgress(data.progress);
    if (data.done) {
      current = null;
      $("work").hidden = true;
      $("done").hidden = false;
      const p = data.progress;
      $("done-summary").textContent =
        `You labelled ${p.mine} pair${p.mine === 1 ? "" : "s"}` +
        (p.skipped ? ` (${p.skipped} skipped)` : "") +
        `. Overall ${p.done} / ${p.total}. Every label is saved.`;
      return;
    }
    $("done").hidden = true;
    $("work").hidden = false;
    current = { pair: data.pair, shownAt: performance.now(), ratings: {} };
    renderPrompt(data.pair.prompt);
    for (const where of ["left", "right"]) {
      const article = $(where);
      renderText(article.querySelector(".text"), data.pair[side(where)]);
      article.querySelector(".text").scrollTop = 0;
      const group = article.querySelector(".rating");
      group.hidden = !ratingsOn;
      group.querySelectorAll("button").forEach((b) => b.classList.remove("on"));
    }
    window.scrollTo(0, 0);
  }

  async function call(url, body) {
    const options = body === undefined ? {} : {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    };
    const response = await fetch(url, options);
    let data = null;
    try { data = await response.json(); } catch (e) { /* not JSON: the status says it */ }
    if (!response.ok) throw new Error((data && data.error) || `HTTP ${response.status}`);
    return data;
  }

  async function loadNext() {
    try {
      render(await call(`/api/next?labeller=${encodeURIComponent(labeller)}`));
    } catch (e) {
      status(`Could not load the next pair: ${e.message}. Reload to try again.`, "error");
    }
  }

  async function choose(choice) {
    if (!current || busy) return;
    busy = true;
    const label = choice === "tie" || choice === "skip" ? choice : side(choice);
    const ratings = {};
    for (const key of ["a", "b"]) if (current.ratings[key]) ratings[key] = current.ratings[key];
    status("saving…", "");
    try {
      const saved = await call("/api/label", {
        labeller, pair: current.pair.id, label, id: current.pair.label_id, left: current.pair.left,
        seconds: (performance.now() - current.shownAt) / 1000, ratings,
      });
      await loadNext();
      status(`saved ✓ (${saved.kind})`, "ok");
    } catch (e) {
      status(`Not saved: ${e.message}. Press again to retry.`, "error");
    } finally {
      busy = false;
    }
  }

  async function undo() {
    if (!last || busy) return;
    busy = true;
    status("undoing…", "");
    try {
      await call("/api/undo", { labeller, id: last });
      await loadNext();
      status("undone: label this pair again", "ok");
    } catch (e) {
      status(`Not undone: ${e.message}`, "error");
    } finally {
      busy = false;
    }
  }

  function rate(where, value, button) {
    if (!current) return;
    const key = side(where);
    const again = current.ratings[key] === value;
    current.ratings[key] = again ? undefined : value;
    button.parentElement.querySelectorAll("button").forEach((b) => b.classList.remove("on"));
    if (!again) button.classList.add("on");
  }

  document.querySelectorAll(".choices [data-choice]").forEach((b) =>
    b.addEventListener("click", () => choose(b.dataset.choice)));
  $("undo").addEventListener("click", undo);
  $("done-undo").addEventListener("click", undo);
  document.querySelectorAll(".rating button").forEach((b) =>
    b.addEventListener("click", () => rate(b.parentElement.dataset.side, b.dataset.rating, b)));
  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) return;
    const keys = { "1": "left", "2": "right", t: "tie", s: "skip" };
    const key = event.key.toLowerCase();
    if (key in keys) { event.preventDefault(); choose(keys[key]); }
    else if (key === "u") { event.preventDefault(); undo(); }
  });
  loadNext();
})();
