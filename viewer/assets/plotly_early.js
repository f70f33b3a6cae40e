/* plotly.js early, while the page waits on the server (benchmarks/NOTES.md, "Issue 20, cold pages
 * round 2"). dcc.Graph loads plotly.js only when a page's first figure mounts, so a cold page paid
 * for compiling it (0.4-1.1 s of the renderer on the 2-core development VM) after the server had
 * answered. The page preloads the file (a <link rel=preload> from viewer/app.py); on a page whose
 * first answer holds a figure this script runs it as soon as Dash has sent its first callback
 * request, when the renderer has nothing else to do until the answer; on the others (Runs,
 * Compare) once that answer is drawn and the renderer is idle, ready for the next page. dcc.Graph
 * then finds window.Plotly. Should a figure come first, dcc.Graph loads the same URL itself:
 * slower, never wrong. */
(function () {
  var URL = "/_dash-component-suites/plotly/package_data/plotly.min.js";
  var FIGURE_PAGES = ["/timeline", "/critical-path", "/idle", "/barriers"];
  var started = false;
  function load() {
    if (started || window.Plotly) { return; }
    started = true;
    var s = document.createElement("script");
    s.src = URL;
    s.async = true;
    document.head.appendChild(s);
  }
  function later() {
    if (window.requestIdleCallback) { window.requestIdleCallback(load, {timeout: 3000}); } else { setTimeout(load, 500); }
  }
  var fetch0 = window.fetch;
  if (typeof fetch0 !== "function") { return; }
  var asked = false;
  window.fetch = function (input) {
    var answer = fetch0.apply(this, arguments);
    if (!asked) {
      var url = typeof input === "string" ? input : (input && input.url) || "";
      if (url.indexOf("_dash-update-component") >= 0) {
        asked = true;
        if (FIGURE_PAGES.indexOf(window.location.pathname) >= 0) {
          setTimeout(load, 0);
        } else {
          answer.then(function () { setTimeout(later, 0); }, function () { setTimeout(later, 0); });
        }
      }
    }
    return answer;
  };
})();
