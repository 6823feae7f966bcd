// The labelling page of `rlhf label`: shows a pair (pick the better answer) or k answers (put them in order), sends
// the label, shows the next item. Every text from the server is inserted with textContent (never as HTML): answers
// are model output. Each user action the page handles that changes its state or sends a label is counted in
// <body data-actions> — the measure of a labeller's effort (docs/labelling.md, "What ranking saves").
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
  let current = null; // {pair, shownAt, ratings: {a, b}} or {rank, shownAt, order, tied}
  let last = null; // id of this labeller's latest saved label (for undo)
  let busy = false;
  let ranked = false; // whether this labeller was given an item to rank (the done screen's wording)

  function act() {
    document.body.dataset.actions = String(Number(document.body.dataset.actions || 0) + 1);
  }

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
      const what = ranked ? "item" : "pair";
      $("done-summary").textContent =
        `You labelled ${p.mine} ${what}${p.mine === 1 ? "" : "s"}` +
        (p.skipped ? ` (${p.skipped} skipped)` : "") +
        `. Overall ${p.done} / ${p.total}. Every label is saved.`;
      return;
    }
    $("done").hidden = true;
    $("work").hidden = false;
    document.body.classList.toggle("mode-rank", Boolean(data.rank));
    document.body.classList.toggle("mode-pair", Boolean(data.pair));
    if (data.rank) {
      ranked = true;
      current = { rank: data.rank, shownAt: performance.now(), order: [], tied: new Set() };
      renderPrompt(data.rank.prompt);
      renderCandidates();
      window.scrollTo(0, 0);
      return;
    }
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

  // Send a label (the route and body), then show the next item; a failure keeps the item and its label id, so
  // pressing again retries and the server saves it once.
  async function send(route, body) {
    busy = true;
    status("saving…", "");
    try {
      const saved = await call(route, { ...body, seconds: (performance.now() - current.shownAt) / 1000 });
      await loadNext();
      status(`saved ✓ (${saved.kind})`, "ok");
    } catch (e) {
      status(`Not saved: ${e.message}. Press again to retry.`, "error");
    } finally {
      busy = false;
    }
  }

  function choose(choice) {
    if (!current || busy) return;
    if (current.rank) {
      if (choice !== "skip") return;
      act();
      send("/api/rank", { labeller, item: current.rank.id, ranking: "skip", id: current.rank.label_id });
      return;
    }
    act();
    const label = choice === "tie" || choice === "skip" ? choice : side(choice);
    const ratings = {};
    for (const key of ["a", "b"]) if (current.ratings[key]) ratings[key] = current.ratings[key];
    send("/api/label", {
      labeller, pair: current.pair.id, label, id: current.pair.label_id, left: current.pair.left, ratings,
    });
  }

  // Ranking: current.order holds the shown positions ranked so far, best first; current.tied the positions tied
  // with the one ranked just above them. The places are the runs of tied positions.
  function places() {
    const groups = [];
    current.order.forEach((pos, i) => {
      if (i > 0 && current.tied.has(pos)) groups[groups.length - 1].push(pos);
      else groups.push([pos]);
    });
    return groups;
  }

  function unranked() {
    return current.rank.answers.map((_, pos) => pos).filter((pos) => !current.order.includes(pos));
  }

  function placeName(n) {
    const suffix = n % 10 === 1 && n !== 11 ? "st" : n % 10 === 2 && n !== 12 ? "nd" : n % 10 === 3 && n !== 13 ? "rd" : "th";
    return `${n}${suffix}`;
  }

  function renderCandidates() {
    const box = $("candidates");
    box.replaceChildren();
    current.rank.answers.forEach((text, pos) => {
      const card = document.createElement("article");
      card.className = "candidate";
      card.dataset.pos = String(pos);
      const pick = document.createElement("button");
      pick.type = "button";
      pick.className = "pick";
      pick.addEventListener("click", () => rankAnswer(pos));
      const body = document.createElement("div");
      body.className = "text";
      renderText(body, text);
      const tie = document.createElement("button");
      tie.type = "button";
      tie.className = "tie-toggle";
      tie.textContent = "= tie with the one above";
      tie.addEventListener("click", () => toggleTie(pos));
      card.append(pick, body, tie);
      box.appendChild(card);
    });
    renderRanking();
  }

  function renderRanking() {
    const place = new Map();
    let n = 1;
    for (const group of places()) {
      for (const pos of group) place.set(pos, { n, tied: group.length > 1 });
      n += group.length;
    }
    document.querySelectorAll("#candidates .candidate").forEach((card) => {
      const pos = Number(card.dataset.pos);
      const at = place.get(pos);
      card.classList.toggle("ranked", Boolean(at));
      const pick = card.querySelector(".pick");
      pick.replaceChildren();
      const badge = document.createElement("span");
      badge.className = "place";
      badge.textContent = at ? `${at.tied ? "=" : ""}${placeName(at.n)}` : "–";
      const label = document.createElement("span");
      label.textContent = ` Answer ${pos + 1}` + (at ? " (tap to take out)" : " (tap to rank next)");
      const key = document.createElement("kbd");
      key.textContent = String(pos + 1);
      pick.append(badge, label);
      if (pos < 9) pick.prepend(key);
      const tie = card.querySelector(".tie-toggle");
      tie.hidden = !at || current.order.indexOf(pos) === 0;
      tie.classList.toggle("on", current.tied.has(pos));
      tie.setAttribute("aria-pressed", String(current.tied.has(pos)));
    });
    const left = unranked();
    const order = places().map((g) => g.map((pos) => pos + 1).join(" = ")).join(" > ");
    $("rank-order").textContent = order ? `Your order: ${order}` + (left.length === 1 ? ` > ${left[0] + 1}` : "")
      : "Your order: nothing ranked yet";
    const submit = $("submit-ranking");
    submit.disabled = left.length > 1;
    submit.lastChild.textContent = left.length === 1 ? ` Submit ranking (answer ${left[0] + 1} last)` : " Submit ranking";
    $("rank-back").disabled = $("rank-clear").disabled = current.order.length === 0;
  }

  function rankable() {
    return current && current.rank && !busy;
  }

  function rankAnswer(pos) {
    if (!rankable() || pos >= current.rank.answers.length) return;
    act();
    const at = current.order.indexOf(pos);
    if (at >= 0) {
      current.order.splice(at, 1);
      current.tied.delete(pos);
      if (at === 0 && current.order.length) current.tied.delete(current.order[0]); // the first ties with nothing
    } else {
      current.order.push(pos);
    }
    renderRanking();
  }

  function toggleTie(pos) {
    if (!rankable() || current.order.indexOf(pos) < 1) return;
    act();
    if (!current.tied.delete(pos)) current.tied.add(pos);
    renderRanking();
  }

  function back() {
    if (!rankable() || !current.order.length) return;
    act();
    current.tied.delete(current.order.pop());
    renderRanking();
  }

  function clear() {
    if (!rankable() || !current.order.length) return;
    act();
    current.order = [];
    current.tied.clear();
    renderRanking();
  }

  // The ranking as the labels file holds it: indices into the item's own answers (shown maps a position to its
  // index), best first, a list for tied ones; the one answer left unranked, if any, is last.
  function submitRanking() {
    if (!rankable()) return;
    const left = unranked();
    if (left.length > 1) {
      status(`Rank ${left.length - 1} more answer${left.length > 2 ? "s" : ""} first (the last one is placed for you).`, "error");
      return;
    }
    const groups = places().concat(left.length ? [[left[0]]] : []);
    if (groups.length < 2) {
      status("Every answer is tied: that prefers nothing. Untie some, or skip.", "error");
      return;
    }
    act();
    const shown = current.rank.shown;
    const ranking = groups.map((g) => (g.length === 1 ? shown[g[0]] : g.map((pos) => shown[pos])));
    send("/api/rank", { labeller, item: current.rank.id, ranking, id: current.rank.label_id });
  }

  async function undo() {
    if (!last || busy) return;
    act();
    busy = true;
    status("undoing…", "");
    try {
      await call("/api/undo", { labeller, id: last });
      await loadNext();
      status(`undone: label this ${current && current.rank ? "item" : "pair"} again`, "ok");
    } catch (e) {
      status(`Not undone: ${e.message}`, "error");
    } finally {
      busy = false;
    }
  }

  function rate(where, value, button) {
    if (!current || !current.pair) return;
    act();
    const key = side(where);
    const again = current.ratings[key] === value;
    current.ratings[key] = again ? undefined : value;
    button.parentElement.querySelectorAll("button").forEach((b) => b.classList.remove("on"));
    if (!again) button.classList.add("on");
  }

  document.querySelectorAll(".choices [data-choice]").forEach((b) =>
    b.addEventListener("click", () => choose(b.dataset.choice)));
  $("undo").addEventListener("click", undo);
  $("submit-ranking").addEventListener("click", submitRanking);
  $("rank-back").addEventListener("click", back);
  $("rank-clear").addEventListener("click", clear);
  $("done-undo").addEventListener("click", undo);
  document.querySelectorAll(".rating button").forEach((b) =>
    b.addEventListener("click", () => rate(b.parentElement.dataset.side, b.dataset.rating, b)));
  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) return;
    const key = event.key.toLowerCase();
    if (key === "u") { event.preventDefault(); undo(); return; }
    if (current && current.rank) {
      // Enter is taken here, so a focused button is not also clicked by it
      const rankKeys = { enter: submitRanking, backspace: back, c: clear, s: () => choose("skip"),
        t: () => current.order.length && toggleTie(current.order[current.order.length - 1]) };
      if (/^[1-9]$/.test(key)) { event.preventDefault(); rankAnswer(Number(key) - 1); }
      else if (key in rankKeys) { event.preventDefault(); rankKeys[key](); }
      return;
    }
    const keys = { "1": "left", "2": "right", t: "tie", s: "skip" };
    if (key in keys) { event.preventDefault(); choose(keys[key]); }
  });
  loadNext();
})();
