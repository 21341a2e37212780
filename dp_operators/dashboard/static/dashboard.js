// The budget dashboard's script: draws the charts the server embeds and tidies the filter form's URLs.
// No inline handlers: the pages' Content-Security-Policy allows scripts from this app only.
"use strict";

{
  // The charts' look, set here once rather than carried by every figure: the parts of plotly's "plotly_white"
  // template (plotly/package_data/templates/plotly_white.json) that the dashboard's bar and scatter charts use.
  const axis = {
    gridcolor: "#EBF0F8", linecolor: "#EBF0F8", ticks: "", title: { standoff: 15 }, zerolinecolor: "#EBF0F8",
    automargin: true, zerolinewidth: 2,
  };
  const TEMPLATE = {
    data: {
      bar: [{ error_x: { color: "#2a3f5f" }, error_y: { color: "#2a3f5f" }, marker: { line: { color: "white", width: 0.5 } } }],
    },
    layout: {
      font: { color: "#2a3f5f" }, hovermode: "closest", hoverlabel: { align: "left" }, paper_bgcolor: "white",
      plot_bgcolor: "white", xaxis: axis, yaxis: axis, shapedefaults: { line: { color: "#2a3f5f" } },
      annotationdefaults: { arrowcolor: "#2a3f5f", arrowhead: 0, arrowwidth: 1 }, title: { x: 0.05 },
      colorway: ["#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692", "#B6E880",
                 "#FF97FF", "#FECB52"],
    },
  };

  // Every <script type="application/json" data-chart-for="ID"> holds a plotly figure ({data, layout}) built in
  // Python (dp_operators/dashboard/charts.py) without a template; draw it into the element with that id.
  for (const source of document.querySelectorAll('script[type="application/json"][data-chart-for]')) {
    const target = document.getElementById(source.dataset.chartFor);
    const figure = JSON.parse(source.textContent);
    const layout = { ...figure.layout, template: TEMPLATE };
    Plotly.newPlot(target, figure.data, layout, { displaylogo: false, responsive: true });
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
