// Draws the comparison page's charts: each [data-figure] element names the json_script
// element holding its Plotly figure dict (built by runs_app/charts.py).
"use strict";

function drawCharts() {
  if (typeof Plotly === "undefined") return;
  for (const element of document.querySelectorAll("[data-figure]")) {
    const source = document.getElementById(element.dataset.figure);
    if (!source || element.dataset.drawn) continue;
    const figure = JSON.parse(source.textContent);
    Plotly.newPlot(element, figure.data, figure.layout, { responsive: true, displaylogo: false });
    element.dataset.drawn = "true";
  }
}

document.addEventListener("DOMContentLoaded", drawCharts);
