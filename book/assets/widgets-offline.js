// Loaded on pages with widgets, after require.js and before the ipywidgets HTML manager
// (nb_ipywidgets_js in _config.yml). Two adjustments for a site that serves its own assets:
"use strict";
(function () {
  // 1. The HTML manager finds its icon fonts next to the AMD module that asks for them, and that
  //    module's URL is derived from its name relative to the page ("notebooks/@jupyter-widgets/...").
  //    Point the names at the folder that holds the vendored manager and its fonts.
  const vendored = new URL("ipywidgets/", document.currentScript.src).href;
  window.require.config({
    paths: { "@jupyter-widgets/html-manager/dist": vendored.replace(/\/$/, "") },
  });

  // 2. The manager typesets widget labels with the MathJax 2 API (MathJax.Hub.Queue); the book
  //    loads MathJax 3, which replaces the window.MathJax object when it starts. Give every
  //    MathJax object the one call the manager makes, translated to MathJax 3.
  function queue(...commands) {
    for (const command of commands) {
      if (!Array.isArray(command) || command[0] !== "Typeset") continue;
      const mathjax = window.MathJax;
      if (!mathjax || !mathjax.startup || !mathjax.startup.promise) continue; // the first typeset will do it
      const element = command[2];
      mathjax.startup.promise
        .then(() => window.MathJax.typesetPromise(element ? [element] : undefined))
        .catch((error) => console.warn("MathJax could not typeset a widget label:", error));
    }
  }
  function withHub(mathjax) {
    if (mathjax && typeof mathjax === "object" && !("Hub" in mathjax)) {
      // Not enumerable: MathJax 3 must not read it as a configuration option.
      Object.defineProperty(mathjax, "Hub", { value: { Queue: queue }, configurable: true });
    }
    return mathjax;
  }
  let current = withHub(window.MathJax);
  Object.defineProperty(window, "MathJax", {
    configurable: true,
    enumerable: true,
    get: () => current,
    set: (value) => {
      current = withHub(value);
    },
  });
})();
