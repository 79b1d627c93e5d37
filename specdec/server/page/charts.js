// Two small SVG charts of one answer's speculation, drawn from the server's `speculation_fit` (the theory of
// core/analysis.py applied to the answer's rounds): acceptance per draft position, and the expected speedup
// against K with the K the engine chose marked. Plain SVG: nothing to load for two charts.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 260, HEIGHT = 120, PAD = 24;

function svgElement(name, attributes) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  return element;
}

function chartFrame(title, className) {
  const figure = document.createElement("figure");
  figure.className = className;
  const svg = svgElement("svg", {width: WIDTH, height: HEIGHT, viewBox: `0 0 ${WIDTH} ${HEIGHT}`});
  svg.append(svgElement("line", {x1: PAD, y1: HEIGHT - PAD, x2: WIDTH - 4, y2: HEIGHT - PAD, stroke: "#57606a"}));
  const caption = document.createElement("figcaption");
  caption.textContent = title;
  figure.append(svg, caption);
  return {figure, svg};
}

function label(svg, x, y, text, anchor = "middle") {
  const element = svgElement("text", {x, y, "font-size": 9, "text-anchor": anchor, fill: "#57606a"});
  element.textContent = text;
  svg.append(element);
}

// alphas[j]: P(draft token j+1 accepted | the ones before it were); samples[j]: the rounds that judged position
// j+1. Positions no round reached are left out (the fit's prior, not a measurement); a bar from fewer than
// FEW rounds is drawn faint and labelled with its count instead of a figure.
const FEW = 3;

function acceptanceChart(alphas, samples) {
  const {figure, svg} = chartFrame("acceptance per draft position", "acceptance-chart");
  const counts = samples || alphas.map(() => FEW);
  const shown = alphas.slice(0, counts.reduce((last, n, j) => (n > 0 ? j + 1 : last), 0));
  const slot = (WIDTH - PAD - 8) / Math.max(shown.length, 1);
  shown.forEach((alpha, j) => {
    const height = alpha * (HEIGHT - 2 * PAD);
    const x = PAD + j * slot + slot * 0.15;
    const few = counts[j] < FEW;
    const bar = svgElement("rect", {x, y: HEIGHT - PAD - height, width: slot * 0.7, height, fill: "#2da44e",
                                    "fill-opacity": few ? 0.35 : 1, "data-position": j + 1, "data-alpha": alpha,
                                    "data-samples": counts[j]});
    const tip = svgElement("title", {});
    tip.textContent = `position ${j + 1}: ${alpha.toFixed(2)} from ${counts[j]} round${counts[j] === 1 ? "" : "s"}`;
    bar.append(tip);
    svg.append(bar);
    label(svg, x + slot * 0.35, HEIGHT - PAD + 11, String(j + 1));
    label(svg, x + slot * 0.35, HEIGHT - PAD - height - 3, few ? `n=${counts[j]}` : alpha.toFixed(2));
  });
  return figure;
}

// speedups[k]: expected speedup at K = k (k = 0: plain decoding, 1.0).
function speedupChart(speedups, chosenK, bestK) {
  const {figure, svg} = chartFrame(`expected speedup vs K (chosen ${chosenK.toFixed(1)}, best ${bestK})`,
                                   "speedup-chart");
  const top = Math.max(...speedups, 1.0) * 1.1;
  const x = k => PAD + k * (WIDTH - PAD - 8) / Math.max(speedups.length - 1, 1);
  const y = value => HEIGHT - PAD - value / top * (HEIGHT - 2 * PAD);
  svg.append(svgElement("line", {x1: PAD, y1: y(1), x2: WIDTH - 4, y2: y(1), stroke: "#d0d7de",
                                 "stroke-dasharray": "3 3"}));
  const points = speedups.map((value, k) => `${x(k)},${y(value)}`).join(" ");
  svg.append(svgElement("polyline", {points, fill: "none", stroke: "#0969da", "stroke-width": 2}));
  speedups.forEach((value, k) => label(svg, x(k), HEIGHT - PAD + 11, String(k)));
  svg.append(svgElement("line", {x1: x(chosenK), y1: PAD / 2, x2: x(chosenK), y2: HEIGHT - PAD, stroke: "#cf222e",
                                 class: "chosen-k"}));
  label(svg, x(bestK), y(speedups[bestK]) - 4, `${speedups[bestK].toFixed(2)}x`);
  return figure;
}

window.specdecCharts = {acceptanceChart, speedupChart};
