/* Cell renderers of the viewer's grids (dash-ag-grid reads them from this object by name).
 *
 * The Runs page's grid (viewer/pages/runs): a run's name links to its timeline, its other pages
 * and its Perfetto trace beside it. Page links move inside the app as dcc.Link does (push the URL,
 * tell dcc.Location), so the router answers without reloading the page; a modified click (new tab)
 * is left to the browser. Text is given to React as text, never as HTML. */
(function () {
  var funcs = (window.dashAgGridComponentFunctions = window.dashAgGridComponentFunctions || {});
  var h = function () { return window.React.createElement.apply(window.React, arguments); };

  function follow(e) {
    if (e.metaKey || e.shiftKey || e.altKey || e.ctrlKey || e.button !== 0) { return; }
    e.preventDefault();
    window.history.pushState({}, "", e.currentTarget.getAttribute("href"));
    window.dispatchEvent(new CustomEvent("_dashprivate_pushstate"));
    window.scrollTo(0, 0);
  }

  function link(href, text, className) {
    return h("a", {href: href, className: className, onClick: follow}, text);
  }

  funcs.RunName = function (props) {
    var d = props.data;
    if (!d) { return null; }
    return h("div", {className: "run-cell"},
      h("div", {className: "run-cell-name"}, link("/timeline" + d.q, d.name, "run-link"),
        d.where ? h("span", {className: "cell-sub run-dir"}, " " + d.where) : null),
      h("div", {className: "cell-sub run-cell-desc"}, d.description));
  };

  funcs.RunPages = function (props) {
    var d = props.data;
    if (!d) { return null; }
    return h("span", {className: "run-pages"},
      link("/critical-path" + d.q, "path", "mini-link"), link("/idle" + d.q, "idle", "mini-link"),
      link("/barriers" + d.q, "barriers", "mini-link"),
      h("a", {href: d.download, className: "mini-link", title: "Perfetto trace"}, "⤓"));
  };
})();
