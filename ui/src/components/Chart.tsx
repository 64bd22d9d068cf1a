// A uPlot time-series chart that follows its container's width. The uPlot instance is kept on
// the element (`__uplot`) so tests can read the data actually plotted.
import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";

export interface SeriesSpec {
  label: string;
  color: string;
  /** Formats values in the legend and on the axis. */
  value?: (v: number) => string;
  dash?: number[];
}

interface Props {
  title: string;
  testid: string;
  series: SeriesSpec[];
  /** [x (unix seconds), ...one array per series]. */
  data: uPlot.AlignedData;
  axis?: (v: number) => string;
  height?: number;
}

export function Chart({ title, testid, series, data, axis, height = 170 }: Props) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);

  useEffect(() => {
    const el = box.current!;
    const css = getComputedStyle(document.documentElement);
    const grid = css.getPropertyValue("--grid").trim() || "#8883";
    const text = css.getPropertyValue("--muted").trim() || "#888";
    const fmt = axis ?? ((v: number) => String(v));
    const opts: uPlot.Options = {
      width: Math.max(200, el.clientWidth),
      height,
      legend: { live: true },
      cursor: { drag: { x: false, y: false } },
      // From zero (or below), with headroom; an all-zero chart still gets a 0..1 axis.
      // With no samples yet, the last fifteen minutes (not uPlot's default of years).
      scales: {
        x: {
          time: true,
          range: (_u, min, max) => {
            const now = Date.now() / 1000;
            if (min == null || max == null || !Number.isFinite(min)) return [now - 900, now];
            return min === max ? [min - 60, max + 1] : [min, max];
          },
        },
        y: { range: (_u, min, max) => [Math.min(0, min ?? 0), max > 0 ? max * 1.1 : 1] } },
      axes: [
        { stroke: text, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid } },
        { stroke: text, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid }, size: 64, values: (_u, ticks) => ticks.map(fmt) },
      ],
      series: [
        { label: "time" },
        ...series.map((s) => ({
          label: s.label,
          stroke: s.color,
          width: 1.5,
          dash: s.dash,
          points: { show: false },
          value: (_u: uPlot, v: number | null) => (v == null ? "–" : (s.value ?? fmt)(v)),
        })),
      ],
    };
    const u = new uPlot(opts, data, el);
    plot.current = u;
    (el as unknown as { __uplot: uPlot }).__uplot = u;
    const resize = new ResizeObserver(() => u.setSize({ width: Math.max(200, el.clientWidth), height }));
    resize.observe(el);
    return () => {
      resize.disconnect();
      u.destroy();
      plot.current = null;
    };
    // the chart is built once; data flows in through setData below
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, []);

  useEffect(() => {
    plot.current?.setData(data);
  }, [data]);

  return (
    <figure class="chart">
      <figcaption>{title}</figcaption>
      <div ref={box} data-testid={testid} class="chart-box" />
    </figure>
  );
}
