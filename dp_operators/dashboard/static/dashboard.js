// The budget dashboard's script: draws the charts the server embeds and tidies the filter form's URLs.
// No inline handlers: the pages' Content-Security-Policy allows scripts from this app only.
"use strict";

{
  // Every <script type="application/json" data-chart-for="ID"> holds a plotly figure ({data, layout}) built in
  // Python (dp_operators/dashboard/charts.py); draw it into the element with that id.
  for (const source of document.querySelectorAll('script[type="application/json"][data-chart-for]')) {
    const target = document.getElementById(source.dataset.chartFor);
    const figure = JSON.parse(source.textContent);
    Plotly.newPlot(target, figure.data, figure.layout, { displaylogo: false, responsive: true });
  }

  // Leave the filter form's empty fields out of the URL (the server reads an empty field as "no filter" too).
  const filters = document.getElementById("charge-filters");
  if (filters) {
    filters.addEventListener("submit", (event) => {
      event.preventDefault();
      const query = new URLSearchParams();
      for (const [name, value] of new FormData(filters)) {
        if (value !== "") query.append(name, value);
      }
      const search = query.toString();
      window.location.assign(filters.action + (search ? "?" + search : ""));
    });
  }
}
