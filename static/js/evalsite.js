/* evalsite: the little JavaScript the pages use. Every page works without it. */
(function () {
  "use strict";
  document.documentElement.classList.add("js");

  // The run page polls only while its event stream is down (see run_detail.html).
  window.evalsiteStreamLive = false;
  document.addEventListener("htmx:sseOpen", function () { window.evalsiteStreamLive = true; });
  document.addEventListener("htmx:sseError", function () { window.evalsiteStreamLive = false; });
  // (A listener, not an hx-trigger condition: htmx evaluates those as code, which the CSP forbids.)
  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    if (window.evalsiteStreamLive && elt && elt.hasAttribute("data-poll-unless-streaming")) event.preventDefault();
  });

  // Same format as the `duration` template filter.
  function duration(seconds) {
    if (seconds < 60) return seconds.toFixed(1) + " s";
    var total = Math.round(seconds), minutes = Math.floor(total / 60), secs = total % 60;
    if (minutes < 60) return minutes + " min " + String(secs).padStart(2, "0") + " s";
    return Math.floor(minutes / 60) + " h " + String(minutes % 60).padStart(2, "0") + " min";
  }

  // Elapsed time keeps ticking between updates of a running run.
  setInterval(function () {
    document.querySelectorAll("[data-elapsed-since]").forEach(function (el) {
      var since = Date.parse(el.getAttribute("data-elapsed-since"));
      if (!isNaN(since)) el.textContent = duration(Math.max(0, (Date.now() - since) / 1000));
    });
  }, 1000);

  // <form data-confirm="…"> asks before submitting (cancel a run, …).
  document.addEventListener("submit", function (event) {
    var message = event.target.getAttribute && event.target.getAttribute("data-confirm");
    if (message && !window.confirm(message)) event.preventDefault();
  });

  // Transcript: filter events by text; expand or collapse every detail.
  document.addEventListener("input", function (event) {
    if (event.target.id !== "transcript-filter") return;
    var query = event.target.value.trim().toLowerCase(), shown = 0;
    var events = document.querySelectorAll("#transcript .event");
    events.forEach(function (el) {
      var hit = !query || el.textContent.toLowerCase().indexOf(query) !== -1;
      el.hidden = !hit;
      if (hit) shown += 1;
      if (query && hit) el.querySelectorAll("details").forEach(function (d) { d.open = true; });
    });
    var count = document.getElementById("transcript-count");
    if (count) count.textContent = query ? shown + " of " + events.length + " events" : events.length + " events";
  });
  // Experiment form: a variant shows the typed option fields of its agent kind only.
  function showKindFields(select) {
    var form = select.closest(".variant-form");
    if (!form) return;
    form.querySelectorAll("[data-kinds]").forEach(function (el) {
      var kinds = el.getAttribute("data-kinds").split(" ");
      var filled = Array.prototype.some.call(el.querySelectorAll("input, select"), function (f) { return f.value; });
      el.hidden = !filled && kinds.indexOf(select.value || "claude-code") === -1;
    });
  }
  document.addEventListener("change", function (event) {
    if (event.target.name && /-agent_type$/.test(event.target.name)) showKindFields(event.target);
    if (event.target.name === "attachment") offerAttachment(event.target);
  });
  // A file chosen to attach is offered as a command variant's Script, and its usual command
  // (the same suggestions as specs/attachments.py: python3 {script} for a .py file).
  var RUNNERS = {py: "python3", sh: "sh", bash: "bash", js: "node", mjs: "node", rb: "ruby"};
  function offerAttachment(input) {
    var file = input.files && input.files[0];
    if (!file) return;
    var suffix = file.name.indexOf(".") === -1 ? "" : file.name.split(".").pop().toLowerCase();
    [["experiment-files", file.name], ["command-suggestions", (RUNNERS[suffix] || "sh") + " {script}"]].forEach(function (pair) {
      var list = document.getElementById(pair[0]);
      if (!list || list.querySelector("option[value='" + CSS.escape(pair[1]) + "']")) return;
      var option = document.createElement("option");
      option.value = pair[1];
      list.appendChild(option);
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("select[name$='-agent_type']").forEach(showKindFields);
  });

  document.addEventListener("click", function (event) {
    var toggle = event.target.closest && event.target.closest("[data-details]");
    if (toggle) {
      var open = toggle.getAttribute("data-details") === "open";
      document.querySelectorAll(toggle.getAttribute("data-target") + " details").forEach(function (d) { d.open = open; });
      return;
    }
    // "Tick all shown": every checkbox of a list (the task-set editor).
    var all = event.target.closest && event.target.closest("[data-check-all]");
    if (all) {
      document.querySelectorAll(all.getAttribute("data-check-all") + " input[type=checkbox]").forEach(function (box) {
        if (!box.closest("[hidden]")) box.checked = true;
      });
      return;
    }
    // Experiment form: "Add variant" copies the formset's empty form.
    var add = event.target.closest && event.target.closest("[data-add-form]");
    if (add) {
      var prefix = add.getAttribute("data-add-form");
      var total = document.getElementById("id_" + prefix + "-TOTAL_FORMS");
      var template = document.getElementById(prefix + "-empty-form");
      var index = parseInt(total.value, 10);
      var holder = document.createElement("div");
      holder.innerHTML = template.innerHTML.replace(/__prefix__/g, String(index)).replace(/__number__/g, String(index + 1));
      var form = holder.firstElementChild;
      document.getElementById(prefix + "-forms").appendChild(form);
      total.value = String(index + 1);
      if (window.htmx) window.htmx.process(form);
      var first = form.querySelector("input[type=text], input:not([type])");
      if (first) first.focus();
    }
  });
})();
