/* plotly.js early, while the page waits on the server (benchmarks/NOTES.md, "Issue 20, cold pages
 * round 2"). dcc.Graph loads plotly.js only when a page's first figure mounts, so a cold page paid
 * for compiling it (0.4-1.1 s of the renderer on the 2-core development VM) after the server had
 * answered. The page preloads the file (a <link rel=preload> from viewer/app.py); on a page whose
 * first answer holds a figure this script runs it as soon as Dash has sent its first callback
 * request, when the renderer has nothing else to do until the answer; on the others (Runs,
 * Compare) once their content is drawn and the renderer is idle, ready for the next page: Compare's
 * first answer, the Runs page's second (its grid's first rows: compiling plotly between the grid's
 * start and its rows request delayed them by ~0.3 s, issue 31). dcc.Graph
 * then finds window.Plotly. Should a figure come first, dcc.Graph loads the same URL itself:
 * slower, never wrong.
 * The same moment, dcc.Graph's lazy chunk is fetched too (a <link rel=preload>, not run): it was
 * asked for only once the answer's graph mounted, 0.05-0.16 s on the loaded 2-core VM before the
 * page's figure could be drawn (issue 31 session 5). Only that one: AG Grid's (0.9 MB) and
 * dcc.Markdown's chunks preloaded as well made no difference measurable on the shared VM (four
 * interleaved rounds at load 16-20), for 1.2 MB more for the server to send while it builds the
 * page; in a traced visit the grids and the first figure were drawn in one task either way. */
(function () {
  var URL = "/_dash-component-suites/plotly/package_data/plotly.min.js";
  var FIGURE_PAGES = ["/timeline", "/critical-path", "/idle", "/barriers"];
  var GRAPH_CHUNK = "/_dash-component-suites/dash/dcc/async-graph.js";
  function chunk() {
    var l = document.createElement("link");
    l.rel = "preload";
    l.as = "script";
    l.href = GRAPH_CHUNK;
    document.head.appendChild(l);
  }
  var ANSWERS_FIRST = {"/": 2};   // answers a page without figures draws before plotly (default 1)
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
  var asked = 0, answered = 0, wanted = 1;
  function landed() {
    answered += 1;
    // a second later: compiling plotly (0.3-0.5 s of the renderer) right after the content is drawn
    // held the first frames and clicks on it
    if (answered === wanted) { setTimeout(later, 1000); }
  }
  window.fetch = function (input) {
    var answer = fetch0.apply(this, arguments);
    var url = typeof input === "string" ? input : (input && input.url) || "";
    if (started || url.indexOf("_dash-update-component") < 0) { return answer; }
    var path = window.location.pathname;
    if (FIGURE_PAGES.indexOf(path) >= 0) {   // a figure comes: now (the user may have come from Runs)
      chunk();
      setTimeout(load, 0);
      return answer;
    }
    if (asked === 0) { wanted = ANSWERS_FIRST[path] || 1; }
    asked += 1;
    if (asked <= wanted) { answer.then(landed, landed); }
    return answer;
  };
})();
