// The work queue's keys (docs/backoffice.md): j and k move between rows, o (or Enter on a row's link) opens one,
// a and r go to the opened item's approve and reject (each still asks: the confirmation, or the reason, then
// Enter), c claims it, x selects the row for a bulk decision, / goes to the search box. Without this script
// every one of them is a link, a button or a form field of the page.
(function () {
  "use strict";
  const rows = () => Array.from(document.querySelectorAll("#queue tbody tr[data-task]"));
  let at = rows().findIndex((r) => r.classList.contains("open"));

  function move(to) {
    const all = rows();
    if (!all.length) return;
    at = Math.min(Math.max(to, 0), all.length - 1);
    all.forEach((r) => r.classList.remove("current"));
    all[at].classList.add("current");
    all[at].querySelector("a.open-link").focus();
  }

  function decide(trigger) {
    const opened = document.getElementById("opened");
    const form = opened && opened.querySelector("form.trigger-" + trigger);
    if (!form) return false;
    const confirm = form.querySelector("details.confirm");
    const field = form.querySelector("textarea[required], input[required]:not([type=hidden])");
    if (field) {
      field.focus();
    } else if (confirm) {
      confirm.open = true;
      confirm.querySelector("button[type=submit]").focus();
    } else {
      form.querySelector("button[type=submit]").focus();
    }
    return true;
  }

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const target = event.target;
    if (target instanceof HTMLInputElement || target instanceof HTMLTextAreaElement || target instanceof HTMLSelectElement) {
      return;
    }
    let done = true;
    switch (event.key) {
      case "j": move(at + 1); break;
      case "k": move(at < 0 ? 0 : at - 1); break;
      case "o": {
        const link = at >= 0 ? rows()[at].querySelector("a.open-link") : null;
        if (link) link.click(); else done = false;
        break;
      }
      case "a": done = decide("approve"); break;
      case "r": done = decide("reject"); break;
      case "c": {
        const claim = document.querySelector("#opened form.claim button");
        if (claim) claim.focus(); else done = false;
        break;
      }
      case "x": {
        const box = at >= 0 ? rows()[at].querySelector("input[type=checkbox]") : null;
        if (box) box.click(); else done = false;
        break;
      }
      case "/": document.getElementById("q").focus(); break;
      default: done = false;
    }
    if (done) event.preventDefault();
  });

  if (at >= 0) rows()[at].classList.add("current");
})();
