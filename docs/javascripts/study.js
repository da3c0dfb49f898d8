// Flashcards with spaced repetition, and a timed mock interview, over the cards the build put in .kb-deck.
// Everything stays in this browser: progress is one JSON object in localStorage (no server, no account).
//
// Leitner boxes: a new card starts in box 1. "Again" sends a card back to box 1, due in a minute; "Hard" keeps
// its box, due in half its interval; "Easy" moves it up one box, due after that box's interval (so a new card
// answered "easy" comes back in a day). A card is "learned" from box 2 on.
//
// A question card's back is its 30-second answer; its push-back ("If they push back", the probes an interviewer
// follows up with) is a separate block one key away (p, or the button). The mock interview reveals in two steps:
// the 30-second answer, then the push-back with the common wrong answers.
(function () {
  "use strict";
  var KEY = "kb-study-v1";
  var MINUTE = 60 * 1000, DAY = 24 * 60 * MINUTE;
  var INTERVAL = [0, 10 * MINUTE, DAY, 3 * DAY, 7 * DAY, 21 * DAY]; // by box
  var TEXT = {
    en: { show: "Show answer (space)", again: "Again (1)", hard: "Hard (2)", easy: "Easy (3)", prev: "◀ Previous",
          next: "Next ▶", shuffle: "Shuffle", reset: "Reset progress", due: "due", learned: "learned", cards: "cards",
          empty: "Nothing is due in this deck. Come back later, or pick another deck.", start: "Start the interview",
          seconds: "Seconds per question", answer: "Your answer (optional, stays in this tab)", timeup: "Time is up.",
          question: "Question", lang: "中文", areas: "Areas", newq: "Next question", confirmReset: "Forget all progress?",
          push: "If they push back (p)", pushMock: "If they push back + wrong answers (p)" },
    zh: { show: "显示答案（空格）", again: "忘记了 (1)", hard: "有点难 (2)", easy: "很简单 (3)", prev: "◀ 上一张",
          next: "下一张 ▶", shuffle: "打乱顺序", reset: "清除进度", due: "待复习", learned: "已掌握", cards: "张卡片",
          empty: "这个卡组暂时没有要复习的卡片。稍后再来，或者换一个卡组。", start: "开始模拟面试",
          seconds: "每题秒数", answer: "你的回答（可选，只保存在本页）", timeup: "时间到。",
          question: "第", lang: "English", areas: "范围", newq: "下一题", confirmReset: "清除全部进度？",
          push: "如果面试官追问 (p)", pushMock: "面试官追问与常见错误 (p)" },
  };

  function load() {
    try { return JSON.parse(localStorage.getItem(KEY)) || { cards: {}, lang: "en" }; }
    catch (e) { return { cards: {}, lang: "en" }; }
  }
  function save(store) { localStorage.setItem(KEY, JSON.stringify(store)); }

  function grade(store, id, g, now) {
    var s = store.cards[id] || { box: 1, due: 0, seen: 0 };
    if (g === 1) { s.box = 1; s.due = now + MINUTE; }
    else if (g === 2) { s.box = Math.max(1, s.box); s.due = now + INTERVAL[s.box] / 2; }
    else { s.box = Math.min(5, s.box + 1); s.due = now + INTERVAL[s.box]; }
    s.seen += 1; s.last = g;
    store.cards[id] = s;
    save(store);
    return s;
  }

  function isDue(store, id, now) { var s = store.cards[id]; return !s || s.due <= now; }
  function isLearned(store, id) { var s = store.cards[id]; return !!s && s.box >= 2; }

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function shuffle(a) {
    for (var i = a.length - 1; i > 0; i--) { var j = Math.floor(Math.random() * (i + 1)); var t = a[i]; a[i] = a[j]; a[j] = t; }
    return a;
  }

  function setup(app) {
    if (app.dataset.ready) return;
    app.dataset.ready = "1";
    var deckEl = app.nextElementSibling && app.nextElementSibling.classList.contains("kb-deck")
      ? app.nextElementSibling : document.querySelector(".kb-deck");
    var mode = app.dataset.mode;
    var cards = Array.prototype.slice.call(deckEl.querySelectorAll(".kb-card"));
    cards.forEach(function (c) {
      if (c.querySelector(".kb-card__front-zh")) c.classList.add("has-zh");
      if (c.querySelector(".kb-card__push-zh")) c.classList.add("has-push-zh");
    });
    deckEl.dataset.mode = mode;
    var store = load();
    var select = app.querySelector(".kb-areas");
    var state = { queue: [], pos: 0, revealed: false, shuffle: false, timer: null, left: 0, round: 0 };

    function t(k) { return TEXT[store.lang || "en"][k]; }
    function inDeck(c) { return select.value === "all" || c.dataset.area === select.value; }
    function current() { return state.queue[state.pos]; }

    var bar = el("div", { class: "kb-bar" });
    var langBtn = el("button", { class: "md-button kb-lang", type: "button" });
    bar.appendChild(select);
    bar.appendChild(langBtn);
    app.appendChild(bar);
    var progress = el("p", { class: "kb-progress", "aria-live": "polite" });
    app.appendChild(progress);

    function applyLang() {
      deckEl.dataset.lang = store.lang || "en";
      langBtn.textContent = t("lang");
      app.querySelectorAll("[data-t]").forEach(function (b) { b.textContent = t(b.dataset.t); });
    }
    langBtn.addEventListener("click", function () {
      var c = current(), revealed = state.revealed, pushed = !!c && c.classList.contains("is-pushed");
      store = load(); store.lang = store.lang === "zh" ? "en" : "zh"; save(store); applyLang(); render();
      if (revealed) reveal(); // the same card, in the other language, as far as it was opened
      if (pushed) setPush(true);
    });

    function button(key, cls) { var b = el("button", { class: "md-button " + cls, type: "button", "data-t": key }); return b; }

    // the second step: the push-back (and, in the mock interview, the common wrong answers)
    function hasPush(card) {
      return !!card && !!card.querySelector(mode === "mock" ? ".kb-card__push, .kb-card__wrong" : ".kb-card__push");
    }

    function show(card) {
      cards.forEach(function (c) { c.classList.remove("is-current", "is-revealed", "is-pushed"); });
      state.revealed = false;
      if (card) card.classList.add("is-current");
      controls.classList.toggle("has-push", hasPush(card));
      pushBtn.setAttribute("aria-expanded", "false");
    }

    function reveal() {
      var c = current();
      if (!c) return;
      state.revealed = true;
      c.classList.add("is-revealed");
      controls.classList.add("is-revealed");
      if (state.timer) { clearInterval(state.timer); state.timer = null; }
    }

    function setPush(on) {
      var c = current();
      if (!hasPush(c)) return;
      if (on && !state.revealed) reveal(); // p on a hidden answer shows the answer and its push-back together
      c.classList.toggle("is-pushed", on);
      pushBtn.setAttribute("aria-expanded", on ? "true" : "false");
      if (on) { // bring what just opened into view (it opens below the answer, often under the fold)
        var shown = Array.prototype.filter.call(c.querySelectorAll(".kb-card__push, .kb-card__push-zh, .kb-card__wrong"),
          function (b) { return b.offsetParent !== null; })[0];
        if (shown && shown.scrollIntoView) shown.scrollIntoView({ block: "nearest" });
      }
    }
    function togglePush() { var c = current(); if (c) setPush(!c.classList.contains("is-pushed")); }

    function counts() {
      var now = Date.now(), deck = cards.filter(inDeck);
      var due = deck.filter(function (c) { return isDue(store, c.dataset.id, now); }).length;
      var learned = deck.filter(function (c) { return isLearned(store, c.dataset.id); }).length;
      return { due: due, learned: learned, total: deck.length };
    }

    // ---- controls -------------------------------------------------------------------------
    var controls = el("div", { class: "kb-controls" });
    var revealBtn = button("show", "kb-reveal md-button--primary");
    var grades = [1, 2, 3].map(function (g) {
      var b = button(["again", "hard", "easy"][g - 1], "kb-grade");
      b.dataset.grade = String(g);
      b.addEventListener("click", function () { doGrade(g); });
      return b;
    });
    var pushBtn = button(mode === "mock" ? "pushMock" : "push", "kb-push");
    pushBtn.setAttribute("aria-expanded", "false");
    pushBtn.addEventListener("click", togglePush);
    revealBtn.addEventListener("click", reveal);
    controls.appendChild(revealBtn);
    controls.appendChild(pushBtn);
    grades.forEach(function (b) { controls.appendChild(b); });

    function doGrade(g) {
      var c = current();
      if (!c || !state.revealed) return;
      store = load();
      grade(store, c.dataset.id, g, Date.now());
      if (mode === "cards") {
        state.queue.splice(state.pos, 1);
        if (g === 1) state.queue.push(c); // relearn it before this session ends
        if (state.pos >= state.queue.length) state.pos = 0;
        render();
      } else {
        nextQuestion();
      }
    }

    if (mode === "cards") {
      var nav = el("div", { class: "kb-nav" });
      var prev = button("prev", "kb-prev"), next = button("next", "kb-next");
      var shuf = el("label", { class: "kb-shuffle" });
      var box = el("input", { type: "checkbox" });
      var shufText = el("span", { "data-t": "shuffle" });
      shuf.appendChild(box); shuf.appendChild(shufText);
      var reset = button("reset", "kb-reset");
      prev.addEventListener("click", function () { move(-1); });
      next.addEventListener("click", function () { move(1); });
      box.addEventListener("change", function () { state.shuffle = box.checked; build(); });
      reset.addEventListener("click", function () {
        if (window.confirm(t("confirmReset"))) { store = load(); store.cards = {}; save(store); build(); }
      });
      nav.appendChild(prev); nav.appendChild(next); nav.appendChild(shuf); nav.appendChild(reset);
      app.appendChild(deckEl); // the card sits between the progress line and its buttons
      app.appendChild(controls);
      app.appendChild(nav);
      var empty = el("p", { class: "kb-empty", "data-t": "empty", hidden: "" });
      app.appendChild(empty);

      var move = function (d) {
        if (!state.queue.length) return;
        state.pos = (state.pos + d + state.queue.length) % state.queue.length;
        render();
      };
      var build = function () {
        var now = Date.now();
        state.queue = cards.filter(function (c) { return inDeck(c) && isDue(store, c.dataset.id, now); });
        state.queue.sort(function (a, b) {
          var sa = store.cards[a.dataset.id], sb = store.cards[b.dataset.id];
          return (sa ? sa.due : Infinity) - (sb ? sb.due : Infinity); // due reviews first, then new cards
        });
        if (state.shuffle) shuffle(state.queue);
        state.pos = 0;
        render();
      };
      var render = function () {
        var n = counts();
        progress.textContent = n.due + " " + t("due") + " · " + n.learned + " " + t("learned") + " · " + n.total + " " + t("cards");
        show(current());
        controls.classList.remove("is-revealed");
        empty.hidden = state.queue.length > 0;
        controls.hidden = !state.queue.length;
      };
      select.addEventListener("change", build);
      document.addEventListener("keydown", function (e) {
        if (!document.body.contains(app) || /INPUT|TEXTAREA|SELECT/.test((e.target || {}).tagName || "")) return;
        if (e.key === " " || e.code === "Space") { e.preventDefault(); if (state.revealed) return; reveal(); }
        else if (e.key === "ArrowRight") move(1);
        else if (e.key === "ArrowLeft") move(-1);
        else if (e.key === "1" || e.key === "2" || e.key === "3") doGrade(Number(e.key));
        else if ((e.key === "p" || e.key === "P") && !e.ctrlKey && !e.metaKey && !e.altKey) {
          e.preventDefault(); e.stopPropagation(); // Material's own "p" (previous page) listens on window
          togglePush();
        }
      });
      applyLang();
      build();
      return;
    }

    // ---- mock interview ---------------------------------------------------------------------
    var settings = el("div", { class: "kb-settings" });
    var areaBox = el("fieldset", { class: "kb-area-choices" });
    areaBox.appendChild(el("legend", { "data-t": "areas" }));
    Array.prototype.slice.call(select.options).forEach(function (o) {
      if (o.value === "all") return;
      var l = el("label"), i = el("input", { type: "checkbox", value: o.value });
      i.checked = true;
      l.appendChild(i); l.appendChild(document.createTextNode(" " + o.textContent));
      areaBox.appendChild(l);
    });
    select.hidden = true;
    var secLabel = el("label", { class: "kb-seconds-label" });
    var secText = el("span", { "data-t": "seconds" });
    var seconds = el("select", { class: "kb-seconds" });
    [60, 120, 180, 300].forEach(function (s) { var o = el("option", { value: String(s) }, String(s)); seconds.appendChild(o); });
    seconds.value = "120";
    secLabel.appendChild(secText); secLabel.appendChild(seconds);
    var start = button("start", "kb-start md-button--primary");
    settings.appendChild(areaBox); settings.appendChild(secLabel); settings.appendChild(start);
    app.appendChild(settings);
    var stage = el("div", { class: "kb-stage", hidden: "" });
    var head = el("p", { class: "kb-round" });
    var timer = el("p", { class: "kb-timer", "aria-live": "off" });
    var notes = el("textarea", { class: "kb-notes", rows: "4" });
    var next2 = button("newq", "kb-next");
    next2.addEventListener("click", nextQuestion);
    stage.appendChild(head); stage.appendChild(timer); stage.appendChild(deckEl); stage.appendChild(notes);
    stage.appendChild(controls); stage.appendChild(next2);
    app.appendChild(stage);

    function chosen() {
      var on = Array.prototype.slice.call(areaBox.querySelectorAll("input:checked")).map(function (i) { return i.value; });
      return cards.filter(function (c) { return on.indexOf(c.dataset.area) >= 0; });
    }
    function tick() {
      state.left -= 1;
      var m = Math.floor(Math.max(state.left, 0) / 60), s = Math.max(state.left, 0) % 60;
      timer.textContent = m + ":" + (s < 10 ? "0" : "") + s;
      if (state.left <= 0) { timer.textContent = t("timeup"); reveal(); }
    }
    function nextQuestion() {
      var pool = chosen();
      if (!pool.length) return;
      var last = current();
      var pick = pool[Math.floor(Math.random() * pool.length)];
      if (pool.length > 1) while (pick === last) pick = pool[Math.floor(Math.random() * pool.length)];
      state.queue = [pick]; state.pos = 0; state.round += 1;
      show(pick);
      controls.classList.remove("is-revealed");
      notes.value = "";
      notes.placeholder = t("answer");
      head.textContent = (store.lang === "zh" ? "第 " + state.round + " 题" : t("question") + " " + state.round);
      state.left = Number(seconds.value) + 1;
      if (state.timer) clearInterval(state.timer);
      state.timer = setInterval(tick, 1000);
      tick();
      render();
    }
    function render() {
      var n = counts();
      progress.textContent = n.due + " " + t("due") + " · " + n.learned + " " + t("learned") + " · " + n.total + " " + t("cards");
    }
    start.addEventListener("click", function () { settings.hidden = true; stage.hidden = false; nextQuestion(); });
    document.addEventListener("keydown", function (e) {
      if (!document.body.contains(app) || stage.hidden || e.ctrlKey || e.metaKey || e.altKey) return;
      if (/INPUT|TEXTAREA|SELECT/.test((e.target || {}).tagName || "")) return; // typing notes
      if (e.key === "p" || e.key === "P") { e.preventDefault(); e.stopPropagation(); togglePush(); }
    });
    applyLang();
    render();
  }

  function init() { document.querySelectorAll(".kb-app").forEach(setup); }
  if (typeof document$ !== "undefined") document$.subscribe(init);
  else document.addEventListener("DOMContentLoaded", init);
})();
