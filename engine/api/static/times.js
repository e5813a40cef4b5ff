// Times in the viewer's time zone (docs/backoffice.md): every <time datetime="..."> of the page is written as
// UTC by the server; this rewrites its text in the browser's zone and keeps the UTC time on hover (its title).
// Without this script the page shows UTC, which is still right.
(function () {
  "use strict";
  const shown = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
    timeZoneName: "short",
  });
  document.querySelectorAll("time[datetime]").forEach((t) => {
    const at = new Date(t.getAttribute("datetime"));
    if (Number.isNaN(at.getTime())) return;
    const utc = at.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
    t.title = utc;
    t.textContent = shown.format(at);
    t.classList.add("local");
  });
})();
