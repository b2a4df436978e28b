// mop console: keyboard review and live preview. Loaded from our own origin only (the
// Content-Security-Policy allows no inline script), and it never builds HTML from card
// text: the preview is HTML the server sanitized.
"use strict";

(function () {
  function typing(el) {
    if (!el) return false;
    var tag = el.tagName;
    // A ticked box or a picked radio button takes no text: the keys still act.
    if (tag === "INPUT") return el.type !== "checkbox" && el.type !== "radio";
    return tag === "TEXTAREA" || tag === "SELECT" || el.isContentEditable;
  }

  // The review queue: j/k move, v verify, r reject, m merge, e edit, c combine a group.
  // After an action the page comes back with the next entry named in its address.
  function queue() {
    var list = document.getElementById("queue");
    if (!list) return;
    var entries = Array.prototype.slice.call(list.querySelectorAll("article.entry"));
    var at = -1;
    function select(i) {
      if (entries.length === 0) return;
      i = Math.max(0, Math.min(entries.length - 1, i));
      if (at >= 0) entries[at].classList.remove("selected");
      at = i;
      entries[at].classList.add("selected");
      entries[at].setAttribute("aria-current", "true");
      entries[at].scrollIntoView({ block: "nearest" });
      entries[at].focus({ preventScroll: true });
    }
    document.addEventListener("keydown", function (ev) {
      if (ev.ctrlKey || ev.metaKey || ev.altKey || typing(ev.target)) return;
      var current = at >= 0 ? entries[at] : null;
      switch (ev.key) {
        case "j": select(at + 1); break;
        case "k": select(at - 1); break;
        case "v":
          // A long card is shown in part here: v opens it, to be read whole first.
          if (current && current.getAttribute("data-whole") === "yes")
            current.querySelector("form.verify").requestSubmit();
          else if (current)
            window.location.assign(current.getAttribute("data-open"));
          break;
        case "r":
          if (current) current.querySelector("form.reject input.reason").focus();
          break;
        case "m":
          if (current && current.querySelector("form.merge select"))
            current.querySelector("form.merge select").focus();
          break;
        case "e":
          if (current) window.location.assign(current.getAttribute("data-edit"));
          break;
        case "c":
          if (current && current.querySelector("form.combine"))
            current.querySelector("form.combine").requestSubmit();
          break;
        default: return;
      }
      ev.preventDefault();
    });
    // Enter on the merge choice merges.
    list.addEventListener("keydown", function (ev) {
      if (ev.key === "Enter" && ev.target.tagName === "SELECT" && ev.target.form) {
        ev.preventDefault();
        ev.target.form.requestSubmit();
      }
    });
    entries.forEach(function (entry, i) {
      entry.addEventListener("click", function () { if (at !== i) select(i); });
    });
    var named = window.location.hash.slice(1);
    for (var i = 0; i < entries.length; i++) {
      if (entries[i].id === named) { select(i); break; }
    }
  }

  // The editor: a preview rendered by the server as the curator types.
  function editor() {
    var form = document.querySelector("form.editor");
    if (!form) return;
    var text = form.querySelector("textarea[name=text]");
    var out = document.getElementById("preview");
    var url = form.getAttribute("data-preview");
    var csrf = form.querySelector("input[name=_csrf]").value;
    var timer = null;
    var seq = 0;
    text.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () {
        var mine = ++seq;
        var body = new URLSearchParams();
        body.set("_csrf", csrf);
        body.set("text", text.value);
        fetch(url, { method: "POST", body: body, credentials: "same-origin" })
          .then(function (r) {
            if (!r.ok) throw new Error(r.status === 401 ? "Your session ended: log in again (your text is still here)." : "Preview failed (" + r.status + ").");
            return r.text();
          })
          .then(function (html) { if (mine === seq) out.innerHTML = html; })
          .catch(function (e) { if (mine === seq) out.textContent = e.message; });
      }, 250);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    queue();
    editor();
  });
})();
