"""The ranking page's one inline script: sort a leaderboard by a column (a click on its
header; again to reverse), and show only the rows the filters choose. It reads the page and
nothing else: no request, no storage. Without it the page is the same table in rank order."""

SCRIPT = r"""
(function () {
  "use strict";
  var filters = Array.prototype.slice.call(document.querySelectorAll("select[data-filter]"));
  function apply() {
    var want = {};
    filters.forEach(function (select) { want[select.dataset.filter] = select.value; });
    var shown = 0, all = 0;
    document.querySelectorAll("section[data-benchmark]").forEach(function (section) {
      section.hidden = Boolean(want.benchmark) && section.dataset.benchmark !== want.benchmark;
    });
    document.querySelectorAll("table.leaderboard tbody tr").forEach(function (row) {
      var keep = Object.keys(want).every(function (key) {
        return !want[key] || row.dataset[key] === want[key];
      });
      row.hidden = !keep;
      all += 1;
      if (keep && !row.closest("section").hidden) { shown += 1; }
    });
    var counter = document.getElementById("shown");
    if (counter) { counter.textContent = shown + " of " + all + " rows shown"; }
  }
  function value(row, index, kind) {
    var text = row.cells[index].dataset.sort;
    if (text === "") { return null; }
    return kind === "number" ? parseFloat(text) : text;
  }
  function sort(header) {
    var table = header.closest("table"), body = table.tBodies[0];
    var index = Array.prototype.indexOf.call(header.parentNode.children, header);
    var kind = header.dataset.kind, now = header.getAttribute("aria-sort");
    var order = now ? (now === "ascending" ? "descending" : "ascending") : header.dataset.first;
    var sign = order === "ascending" ? 1 : -1;
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = value(a, index, kind), y = value(b, index, kind);
      if (x === null || y === null) { return (x === null) - (y === null); }
      return (x < y ? -1 : x > y ? 1 : 0) * sign;
    });
    rows.forEach(function (row) { body.appendChild(row); });
    table.querySelectorAll("th").forEach(function (th) { th.removeAttribute("aria-sort"); });
    header.setAttribute("aria-sort", order);
  }
  document.querySelectorAll("table.leaderboard th button").forEach(function (button) {
    button.addEventListener("click", function () { sort(button.parentNode); });
  });
  filters.forEach(function (select) { select.addEventListener("change", apply); });
  apply();
})();
"""
