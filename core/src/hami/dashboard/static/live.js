// Live updates: ask /live every few seconds whether the cluster changed; when it did, fetch this page again and
// swap its <main> in place (no reload, focus and scroll kept). The server renders everything; this only polls.
(function () {
  "use strict";
  var every = parseInt(document.body.dataset.pollMs || "2000", 10);
  var busy = false;

  function swap(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html");
    var main = fresh.getElementById("content");
    var updated = fresh.getElementById("updated");
    if (!main) { return; }
    document.getElementById("content").replaceWith(main);
    if (updated) { document.getElementById("updated").innerHTML = updated.innerHTML; }
    document.title = fresh.title;
  }

  function tick() {
    if (busy || document.hidden) { return; }
    busy = true;
    fetch("/live", {cache: "no-store"})
      .then(function (r) { return r.json(); })
      .then(function (live) {
        var shown = document.getElementById("content").dataset.version;
        var stale = !!document.getElementById("stale");
        if (live.version === shown && !!live.stale === stale) { return null; }
        return fetch(window.location.href, {cache: "no-store"}).then(function (r) { return r.text(); }).then(swap);
      })
      .catch(function () {
        var updated = document.getElementById("updated");
        if (updated) { updated.textContent = "the dashboard is not answering; retrying"; }
      })
      .then(function () { busy = false; });
  }

  window.setInterval(tick, every);
})();
