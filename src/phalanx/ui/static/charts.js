// Metric charts, drawn by uPlot (vendored: /static/vendor/): one chart per metric, the attempts'
// starts marked as dashed lines, several runs overlaid on the compare page. Drag to zoom,
// double-click to zoom out.

import { h } from "./dom.js";

export const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f", "#7c2d12", "#334155", "#ca8a04", "#0f766e"];
const HEIGHT = 200;

function width(container) {
  return Math.max(240, Math.floor(container.getBoundingClientRect().width) - 4);
}

// The attempts' starts (after the first) as dashed vertical lines with their number.
function attemptLines(starts) {
  return (u) => {
    const { ctx, bbox } = u;
    ctx.save();
    ctx.strokeStyle = "#9ca3af";
    ctx.fillStyle = "#6b7280";
    ctx.setLineDash([4, 4]);
    ctx.font = `${Math.round(10 * devicePixelRatio)}px sans-serif`;
    for (const start of starts().slice(1)) {
      const x = Math.round(u.valToPos(start.x, "x", true));
      if (x < bbox.left || x > bbox.left + bbox.width) continue;
      ctx.beginPath();
      ctx.moveTo(x, bbox.top);
      ctx.lineTo(x, bbox.top + bbox.height);
      ctx.stroke();
      ctx.fillText(`attempt ${start.attempt}`, x + 3 * devicePixelRatio, bbox.top + 12 * devicePixelRatio);
    }
    ctx.restore();
  };
}

function options(title, container, series, starts) {
  return {
    title,
    width: width(container),
    height: HEIGHT,
    scales: { x: { time: false } },
    series: [{ label: "iteration" }, ...series],
    axes: [{ grid: { stroke: "#eef0f3" } }, { size: 64, grid: { stroke: "#eef0f3" } }],
    cursor: { drag: { x: true, y: false } },
    legend: { live: true },
    hooks: { draw: [attemptLines(starts)] },
  };
}

// One metric of one run: `data` is {x, y}; `starts()` the attempts' first iterations.
export class MetricChart {
  constructor(parent, name, data, starts) {
    this.name = name;
    this.box = h("div", { class: "chart", dataset: { metric: name } });
    parent.append(this.box);
    this.starts = starts;
    const series = [{ label: name, stroke: COLORS[0], width: 1.5, spanGaps: true, points: { show: false } }];
    this.plot = new window.uPlot(options(name, this.box, series, () => this.starts()), [data.x, data.y], this.box);
  }

  update(data) {
    this.plot.setData([data.x, data.y]);
  }

  resize() {
    this.plot.setSize({ width: width(this.box), height: HEIGHT });
  }

  destroy() {
    this.plot.destroy();
    this.box.remove();
  }
}

// One metric of several runs: `curves` is [[label, {x, y}], ...].
export class OverlayChart {
  constructor(parent, name, curves) {
    this.box = h("div", { class: "chart", dataset: { metric: name } });
    parent.append(this.box);
    const data = window.uPlot.join(curves.map(([, c]) => [c.x, c.y]));
    const series = curves.map(([label], i) => ({
      label,
      stroke: COLORS[i % COLORS.length],
      width: 1.5,
      spanGaps: true,
      points: { show: false },
    }));
    this.plot = new window.uPlot(options(name, this.box, series, () => []), data, this.box);
  }

  resize() {
    this.plot.setSize({ width: width(this.box), height: HEIGHT });
  }
}

export function onResize(charts) {
  let pending = null;
  window.addEventListener("resize", () => {
    clearTimeout(pending);
    pending = setTimeout(() => charts().forEach((c) => c.resize()), 100);
  });
}
