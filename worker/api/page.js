// What the live page (/) and a batch's page (/batches/{id}) share: the API key, fetching JSON, formatting,
// download links, and lineChart, a line chart drawn as plain SVG.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function apiKey() { return sessionStorage.getItem("miro-key"); }

function headers() { return apiKey() ? {Authorization: "Bearer " + apiKey()} : {}; }

// The JSON of a GET, or null after showing the key form when the server wants a key.
async function getJSON(url) {
  const response = await fetch(url, {headers: headers()});
  if (response.status === 401) {
    document.getElementById("key-form").style.display = "block";
    return null;
  }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
  return body;
}

// The pollers go on through a 401 (they reschedule themselves), so the next poll sends the key.
function setUpKeyForm() {
  document.getElementById("key-save").addEventListener("click", () => {
    sessionStorage.setItem("miro-key", document.getElementById("key").value);
    document.getElementById("key-form").style.display = "none";
  });
}

function cell(text, className) {
  const td = document.createElement("td");
  if (className) td.className = className;
  td.textContent = text;
  return td;
}

function bar(fraction, className) {
  const td = document.createElement("td"), outer = document.createElement("span"), inner = document.createElement("span");
  outer.className = "bar";
  inner.className = "fill " + (className || "");
  inner.style.display = "block";
  inner.style.width = (100 * Math.min(Math.max(fraction, 0), 1)).toFixed(1) + "%";
  outer.appendChild(inner);
  td.appendChild(outer);
  td.appendChild(document.createTextNode(" " + (100 * fraction).toFixed(0) + "%"));
  return td;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 60) return seconds.toFixed(0) + " s";
  if (seconds < 3600) return (seconds / 60).toFixed(0) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}

function rate(value) { return value === null || value === undefined ? "–" : value.toFixed(value < 10 ? 1 : 0); }

function clock(epoch) { return new Date(epoch * 1000).toLocaleTimeString(); }

// Links carry no headers, so with a key the download goes through fetch and a blob.
function download(url, filename) {
  const a = document.createElement("a");
  a.textContent = filename.endsWith(".parquet") ? "parquet" : filename.includes("error") ? "errors" : "output";
  a.href = url;
  a.download = filename;
  a.addEventListener("click", async (event) => {
    if (!apiKey()) return;
    event.preventDefault();
    const response = await fetch(url, {headers: headers()});
    const link = document.createElement("a");
    link.href = URL.createObjectURL(await response.blob());
    link.download = filename;
    link.click();
  });
  return a;
}

function downloads(b) {
  const links = document.createElement("td");
  links.appendChild(download("/v1/batches/" + b.id + "/results.parquet", b.id + ".parquet"));
  for (const [id, name] of [[b.output_file_id, "output"], [b.error_file_id, "error"]]) {
    if (!id) continue;
    links.appendChild(document.createTextNode(" "));
    links.appendChild(download("/v1/files/" + id + "/content", b.id + "_" + name + ".jsonl"));
  }
  return links;
}

const COLORS = ["#3b82f6", "#10b981", "#f59e0b", "#ef4444", "#8b5cf6", "#06b6d4", "#ec4899", "#84cc16"];

function svgElement(name, attributes, text) {
  const element = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  if (text !== undefined) element.textContent = text;
  return element;
}

function tick(value) {
  if (value >= 1000) return (value / 1000).toFixed(value >= 10000 ? 0 : 1) + "k";
  return value >= 10 || value === 0 ? value.toFixed(0) : value.toFixed(1);
}

// Draws lines = [{label, points: [[epoch seconds, value], ...]}] into the <svg> element, replacing what it held:
// a time axis, four value grid lines from 0 (to opts.yMax, or above the highest value), a polyline per line
// (data-label names it) and a legend. opts.percent shows values 0-1 as percentages.
function lineChart(svg, lines, opts = {}) {
  const W = 640, H = 200, left = 48, right = 12, top = 22, bottom = 24;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.replaceChildren();
  const all = lines.flatMap(line => line.points);
  if (all.length < 2) {
    svg.appendChild(svgElement("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "chart-empty"},
                                "No points yet: workers add one every few seconds."));
    return;
  }
  const tMin = Math.min(...all.map(p => p[0])), tMax = Math.max(...all.map(p => p[0]), tMin + 1);
  const highest = Math.max(...all.map(p => p[1]));
  const yMax = opts.yMax || (highest > 0 ? highest * 1.15 : 1);
  const x = t => left + (W - left - right) * (t - tMin) / (tMax - tMin);
  const y = v => H - bottom - (H - top - bottom) * Math.min(v, yMax) / yMax;
  for (let i = 0; i <= 4; i++) {
    const value = yMax * i / 4, at = y(value);
    svg.appendChild(svgElement("line", {x1: left, x2: W - right, y1: at, y2: at, class: "chart-grid"}));
    svg.appendChild(svgElement("text", {x: left - 6, y: at + 4, "text-anchor": "end", class: "chart-tick"},
                               opts.percent ? (100 * value).toFixed(0) + "%" : tick(value)));
  }
  for (const [t, anchor] of [[tMin, "start"], [(tMin + tMax) / 2, "middle"], [tMax, "end"]]) {
    svg.appendChild(svgElement("text", {x: x(t), y: H - 6, "text-anchor": anchor, class: "chart-tick"}, clock(t)));
  }
  let legendX = left;
  lines.forEach((line, i) => {
    const color = COLORS[i % COLORS.length];
    const points = line.points.map(p => x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1)).join(" ");
    svg.appendChild(svgElement("polyline", {points, fill: "none", stroke: color, "stroke-width": 2,
                                            "data-label": line.label, class: "chart-line"}));
    const label = svgElement("text", {x: legendX, y: 14, fill: color, class: "chart-legend"}, line.label);
    svg.appendChild(label);
    legendX += 12 + 7 * line.label.length;
  });
}
