// The staff latency dashboard: charts (uPlot) over /admin/latency/data, refreshed live.
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import { request } from '../api';
import { xAxis } from './axis';
import './dashboard.css';

type Num = number | null;
type Series = Record<string, Num[]> & { t: number[] };
interface SlowRow {
  id: number; finished_at: string; source: string; user: string; conversation_id: number | null;
  request_id: string; worker: string; e2e: Num; queue: Num; prefill: Num; decode: Num;
  network: Num; ttft: Num; itl_p99: Num; prompt_tokens: number; cached_tokens: number;
  output_tokens: number; preemptions: number; finish_reason: string; error_code: string;
}
interface BenchRun {
  id: number; status: string; created_at: string; finished_at: string | null;
  summary: Record<string, Num>; targets: { target: string; measured: unknown; bar: string; met: boolean | null }[];
  machine: string; plot_url: string | null; log_tail: string; cancel_url?: string | null;
}
interface Spread { median: Num; min: Num; max: Num }
interface TuningRow {
  settings: Record<string, number | string>; label: string; current: boolean; requests: number;
  goodput_rps: Spread; ttft_p50: Spread; tpot_p50: Spread; throughput_tok_s: Spread;
  runs: { met_targets: number; refused: number }[];
}
interface TuningRun {
  id: number; status: string; created_at: string; log_tail: string; cancel_url?: string | null;
  progress?: { trials_done: number; trials: number; elapsed_s: number } | null;
  report: { workload?: string; requests?: number; targets?: { ttft_s: number; tpot_s: number };
    method?: { repeats: number; rule: string }; rows?: TuningRow[];
    winner?: Record<string, number | string> | null; verdict?: string; env?: string };
}
interface Data {
  window: string; bucket_s: number; now: number; series: Series;
  summary: Record<string, unknown> & { errors: Record<string, number> };
  slowest: SlowRow[]; benchmarks: BenchRun[]; tuning: TuningRun[];
  kv_tier?: { enabled?: boolean; entries?: number; bytes?: number; finished_at?: string } | null;
}

/** GET /api/feedback/: the owners' thumbs on replies (docs/http.md, "Feedback"). */
interface FeedbackSummary {
  models: { model: string; up: number; down: number }[];
  recent: { message_id: number; conversation_id: number; model: string | null; rating: 'up' | 'down'; comment: string; reply: string; at: string | null }[];
}

interface ChartSpec {
  id: string; title: string; unit: string; scale?: number;
  lines: { key: string; label: string; color: string }[];
}

const C = { p50: '#2563eb', p90: '#f59e0b', p99: '#dc2626', a: '#059669', b: '#7c3aed', c: '#64748b' };
const CHARTS: ChartSpec[] = [
  { id: 'ttft', title: 'Time to first token', unit: 'ms', scale: 1000, lines: [
    { key: 'ttft_p50', label: 'p50', color: C.p50 }, { key: 'ttft_p90', label: 'p90', color: C.p90 },
    { key: 'ttft_p99', label: 'p99', color: C.p99 }] },
  { id: 'itl', title: 'Inter-token latency and TPOT', unit: 'ms', scale: 1000, lines: [
    { key: 'itl_p50', label: 'ITL p50', color: C.p50 }, { key: 'itl_p99', label: 'ITL p99', color: C.p99 },
    { key: 'tpot_p50', label: 'TPOT p50', color: C.a }, { key: 'tpot_p99', label: 'TPOT p99', color: C.b }] },
  { id: 'e2e', title: 'End-to-end latency', unit: 's', lines: [
    { key: 'e2e_p50', label: 'p50', color: C.p50 }, { key: 'e2e_p99', label: 'p99', color: C.p99 }] },
  { id: 'queue', title: 'Queue time', unit: 'ms', scale: 1000, lines: [
    { key: 'queue_p50', label: 'p50', color: C.p50 }, { key: 'queue_p99', label: 'p99', color: C.p99 }] },
  { id: 'tps', title: 'Output tokens per second', unit: 'tok/s', lines: [
    { key: 'out_tok_s', label: 'tok/s', color: C.a }] },
  { id: 'load', title: 'Requests running and waiting', unit: 'requests', lines: [
    { key: 'running', label: 'running', color: C.p50 }, { key: 'waiting', label: 'waiting', color: C.p99 }] },
  { id: 'batch', title: 'Batch size per step', unit: 'sequences', lines: [
    { key: 'batch_size', label: 'batch size', color: C.b }] },
  { id: 'kv', title: 'KV cache usage', unit: '%', scale: 100, lines: [
    { key: 'kv_usage', label: 'used', color: C.p90 }] },
  { id: 'prefix', title: 'Prefix-cache hit rate', unit: '%', scale: 100, lines: [
    { key: 'prefix_hit_rate', label: 'memory tier', color: C.a },
    { key: 'redis_hit_rate', label: 'Redis tier', color: C.b }] },
  { id: 'spec', title: 'Speculative acceptance', unit: '%', scale: 100, lines: [
    { key: 'spec_accept', label: 'accepted / drafted', color: C.p50 }] },
  { id: 'errors', title: 'Errors and refusals', unit: 'count', lines: [
    { key: 'errors', label: 'errors', color: C.p99 }, { key: 'refused', label: 'refused busy', color: C.c }] },
];

function el<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Record<string, string> = {}, text = ''): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text) node.textContent = text;
  return node;
}

function fmt(v: unknown, scale = 1, digits = 1): string {
  if (v === null || v === undefined || typeof v !== 'number' || Number.isNaN(v)) return '–';
  return (v * scale).toFixed(digits);
}

class Dashboard {
  root: HTMLElement;
  window: string;
  plots = new Map<string, uPlot>();
  timer: number | undefined;
  dataUrl: string;
  benchUrl: string;
  tuningUrl: string;

  constructor(root: HTMLElement) {
    this.root = root;
    this.dataUrl = root.dataset.dataUrl || '/admin/latency/data';
    this.benchUrl = root.dataset.benchmarkUrl || '/admin/latency/benchmarks';
    this.tuningUrl = root.dataset.tuningUrl || '/admin/latency/tuning';
    const params = new URLSearchParams(location.search);
    this.window = params.get('window') || '5m';
    this.layout((root.dataset.windows || '5m,1h,24h,7d').split(','));
    void this.refresh();
  }

  layout(windows: string[]): void {
    const bar = el('div', { class: 'ld-bar' });
    bar.append(el('span', { class: 'ld-label' }, 'Window'));
    for (const w of windows) {
      const b = el('button', { type: 'button', 'data-window': w, class: w === this.window ? 'active' : '' }, w);
      b.addEventListener('click', () => this.setWindow(w));
      bar.append(b);
    }
    bar.append(el('span', { class: 'ld-status', id: 'ld-status' }, 'loading…'));
    const tiles = el('div', { class: 'ld-tiles', id: 'ld-tiles' });
    const grid = el('div', { class: 'ld-grid' });
    for (const spec of CHARTS) {
      const card = el('section', { class: 'ld-card', id: `chart-${spec.id}` });
      card.append(el('h3', {}, `${spec.title} (${spec.unit})`));
      card.append(el('div', { class: 'ld-plot' }));
      grid.append(card);
    }
    const errors = el('section', { class: 'ld-card', id: 'ld-errors' });
    errors.append(el('h3', {}, 'Errors and refusals by kind'), el('table', { class: 'ld-table' }));
    grid.append(errors);
    const slow = el('section', { class: 'ld-wide', id: 'ld-slowest' });
    slow.append(el('h2', {}, 'Slowest recent requests'), el('p', { class: 'ld-help' },
      'Where each request spent its time: queue (waiting for a batch slot), prefill (prompt until the first token), decode (the rest of the reply), network (after the engine finished, until the server was done sending).'));
    slow.append(el('table', { class: 'ld-table' }));
    const bench = el('section', { class: 'ld-wide', id: 'ld-bench' });
    const start = el('button', { type: 'button', id: 'ld-bench-start' }, 'Run benchmark (inference.bench --quick)');
    start.addEventListener('click', () => void this.startBenchmark());
    bench.append(el('h2', {}, 'Benchmark runs'), start, el('div', { id: 'ld-bench-runs' }));
    const tune = el('section', { class: 'ld-wide', id: 'ld-tuning' });
    const tuneStart = el('button', { type: 'button', id: 'ld-tune-start' }, 'Tune serving settings');
    tuneStart.addEventListener('click', () => void this.post(this.tuningUrl, tuneStart));
    tune.append(el('h2', {}, 'Serving-settings tuning'), el('p', { class: 'ld-help' },
      'Replays the recent requests (or a synthetic stream) under the current settings and, one change at a time, other token budgets, sequence caps, speculation modes and chat flush intervals; each setting runs several times, interleaved, on an engine with the Redis KV tier off and a cold prefix cache. Goodput counts the requests per second that meet both the TTFT and the TPOT target; a winner is named only when its worst run beats the best run of the current settings and of every other setting that beats them.'),
      tuneStart, el('div', { id: 'ld-tune-runs' }));
    const feedback = el('section', { class: 'ld-wide', id: 'ld-feedback' });
    const download = el('a', { href: '/api/feedback/export.jsonl', download: 'feedback.jsonl' }, 'Download all as JSON Lines');
    feedback.append(el('h2', {}, 'Feedback on replies'), el('p', { class: 'ld-help' },
      'Thumbs up and down that users gave replies, with their comments (temporary chats not counted). The download has every rated reply with the conversation up to it, for evaluation; no user names.'),
      download, el('div', { id: 'ld-feedback-body' }));
    this.root.append(bar, tiles, grid, slow, bench, tune, feedback);
  }

  setWindow(w: string): void {
    this.window = w;
    for (const b of this.root.querySelectorAll<HTMLButtonElement>('.ld-bar button')) {
      b.classList.toggle('active', b.dataset.window === w);
    }
    history.replaceState(null, '', `?window=${w}`);
    for (const p of this.plots.values()) p.destroy();
    this.plots.clear();
    void this.refresh();
  }

  async refresh(): Promise<void> {
    window.clearTimeout(this.timer);
    const status = this.root.querySelector('#ld-status') as HTMLElement;
    try {
      const data = await request<Data>('GET', `${this.dataUrl}?window=${encodeURIComponent(this.window)}`);
      this.render(data);
      void this.refreshFeedback();
      status.textContent = `updated ${new Date().toLocaleTimeString()} · ${data.bucket_s}s buckets`;
      this.root.dataset.ready = '1';
    } catch (err) {
      status.textContent = `update failed: ${(err as Error).message}`;
    }
    this.timer = window.setTimeout(() => void this.refresh(), this.window === '5m' ? 5000 : 30000);
  }

  render(d: Data): void {
    this.renderTiles(d);
    for (const spec of CHARTS) this.renderChart(spec, d.series);
    this.renderErrors(d);
    this.renderSlowest(d.slowest);
    this.renderBench(d.benchmarks);
    this.renderTuning(d.tuning || []);
  }

  renderTuning(runs: TuningRun[]): void {
    const box = this.root.querySelector('#ld-tune-runs') as HTMLElement;
    const run = runs[0];
    if (!run) {
      box.replaceChildren(el('p', { class: 'ld-help' }, 'No tuning runs yet.'));
      return;
    }
    const r = run.report || {};
    const head = el('p', {}, `Run #${run.id}: ${run.status}` + (r.targets
      ? ` · ${r.requests} ${r.workload} requests · targets TTFT ≤ ${r.targets.ttft_s * 1000} ms, TPOT ≤ ${r.targets.tpot_s * 1000} ms`
      : ''));
    const parts: HTMLElement[] = [head];
    if (run.progress) parts.push(el('p', { id: 'ld-tune-progress' }, `trial ${run.progress.trials_done} of ${run.progress.trials} done · ${Math.round(run.progress.elapsed_s)} s`));
    if (run.cancel_url) parts.push(this.cancelButton(run.cancel_url, 'ld-tune-cancel'));
    const range = (v: Spread, scale: number, digits: number): string =>
      `${fmt(v.median, scale, digits)} (${fmt(v.min, scale, digits)}–${fmt(v.max, scale, digits)})`;
    if (r.rows) {
      if (r.verdict) parts.push(el('p', { id: 'ld-tune-verdict' }, r.verdict));
      const table = el('table', { class: 'ld-table' });
      const tr0 = el('tr');
      for (const h of ['setting', 'goodput req/s', 'met / all', 'refused', 'tok/s', 'TTFT p50 ms', 'TPOT p50 ms']) tr0.append(el('th', {}, h));
      table.append(tr0);
      for (const row of r.rows) {
        const isWinner = !!r.winner && JSON.stringify(row.settings) === JSON.stringify(r.winner);
        const tr = el('tr', { class: isWinner ? 'ld-best' : '' });
        const met = row.runs.map((x) => x.met_targets).join(', ');
        tr.append(
          el('td', {}, row.label),
          el('td', { class: 'num' }, range(row.goodput_rps, 1, 2)),
          el('td', { class: 'num' }, `${met} / ${row.requests}`),
          el('td', { class: 'num' }, row.runs.map((x) => x.refused).join(', ')),
          el('td', { class: 'num' }, range(row.throughput_tok_s, 1, 1)),
          el('td', { class: 'num' }, range(row.ttft_p50, 1000, 0)),
          el('td', { class: 'num' }, range(row.tpot_p50, 1000, 1)),
        );
        table.append(tr);
      }
      parts.push(table, el('p', { class: 'ld-help' },
        `Median (min–max) over ${r.method?.repeats ?? '?'} runs per setting; met / refused: each run's count.`));
      if (r.winner) {
        const apply = el('button', { type: 'button', id: 'ld-tune-apply' }, `Apply the winner (${r.env})`);
        apply.addEventListener('click', () => void this.post(`${this.tuningUrl}/${run.id}/apply`, apply));
        parts.push(apply, el('p', { class: 'ld-help' }, `To keep it after a restart, set ${r.env}.`));
      }
    }
    if (run.log_tail) parts.push(el('pre', { class: 'ld-log' }, run.log_tail));
    box.replaceChildren(...parts);
  }

  /** Cancel a queued or running job (the server stops it between steps). */
  cancelButton(url: string, id?: string): HTMLButtonElement {
    const b = el('button', { type: 'button', class: 'ld-cancel', ...(id ? { id } : {}) }, 'Cancel') as HTMLButtonElement;
    b.addEventListener('click', () => void this.post(url, b));
    return b;
  }

  async post(url: string, button: HTMLButtonElement): Promise<void> {
    button.disabled = true;
    try {
      await request('POST', url);
      void this.refresh();
    } catch (err) {
      // Said in the status line until the next periodic refresh.
      (this.root.querySelector('#ld-status') as HTMLElement).textContent = `${button.textContent} failed: ${(err as Error).message}`;
    } finally {
      button.disabled = false;
    }
  }

  renderTiles(d: Data): void {
    const s = d.summary as Record<string, number | null>;
    const tiles: [string, string][] = [
      ['requests', String(s.requests ?? 0)],
      ['TTFT p50 / p99 ms', `${fmt(s.ttft_p50, 1000, 0)} / ${fmt(s.ttft_p99, 1000, 0)}`],
      ['ITL p50 / p99 ms', `${fmt(s.itl_p50, 1000, 0)} / ${fmt(s.itl_p99, 1000, 0)}`],
      ['e2e p50 / p99 s', `${fmt(s.e2e_p50, 1, 2)} / ${fmt(s.e2e_p99, 1, 2)}`],
      ['queue p99 ms', fmt(s.queue_time_p99, 1000, 0)],
      ['prefix hit rate', s.prefix_hit_rate == null ? '–' : `${fmt(s.prefix_hit_rate, 100, 0)}%`],
      ['errors', String(s.error_count ?? 0)],
    ];
    // Replies the response cache replayed (docs/response-cache.md), shown once there are any.
    if (s.replays) tiles.push(['cached replies (TTFT p50 ms)', `${s.replays} (${fmt(s.replay_ttft_p50, 1000, 1)})`]);
    // The Redis KV tier's size as of its latest upkeep pass (inference/kv_upkeep.py).
    const kv = d.kv_tier;
    if (kv && kv.enabled && kv.entries != null) {
      tiles.push(['Redis KV tier blocks / MB', `${kv.entries} / ${fmt(kv.bytes ?? 0, 1 / 2 ** 20, 1)}`]);
    }
    const box = this.root.querySelector('#ld-tiles') as HTMLElement;
    box.replaceChildren(...tiles.map(([k, v]) => {
      const t = el('div', { class: 'ld-tile' });
      t.append(el('div', { class: 'ld-tile-v' }, v), el('div', { class: 'ld-tile-k' }, k));
      return t;
    }));
  }

  renderChart(spec: ChartSpec, series: Series): void {
    const scale = spec.scale ?? 1;
    const data: uPlot.AlignedData = [
      series.t,
      ...spec.lines.map((l) => (series[l.key] || []).map((v) => (v == null ? null : v * scale))),
    ];
    const empty = spec.lines.every((l) => (series[l.key] || []).every((v) => v == null));
    this.root.querySelector(`#chart-${spec.id}`)?.classList.toggle('ld-empty', empty);
    const existing = this.plots.get(spec.id);
    if (existing) {
      existing.setData(data);
      return;
    }
    const box = this.root.querySelector(`#chart-${spec.id} .ld-plot`) as HTMLElement;
    const width = Math.max(280, box.clientWidth || 420);
    const plot = new uPlot(
      {
        width,
        height: 190,
        legend: { show: true },
        scales: { x: { time: true }, y: { range: (_u, min, max) => [Math.min(0, min ?? 0), Math.max(max ?? 1, 1e-9) * 1.1] } },
        axes: [xAxis('#64748b') as uPlot.Axis, { stroke: '#64748b', size: 56 }],
        series: [
          {},
          ...spec.lines.map((l) => ({
            label: l.label,
            stroke: l.color,
            width: 2,
            spanGaps: false,
            points: { show: true, size: 4 },
            value: (_u: uPlot, v: number | null) => (v == null ? '–' : v.toFixed(1)),
          })),
        ],
      },
      data,
      box,
    );
    this.plots.set(spec.id, plot);
  }

  renderErrors(d: Data): void {
    const table = this.root.querySelector('#ld-errors table') as HTMLTableElement;
    const rows = Object.entries(d.summary.errors || {}).sort((a, b) => b[1] - a[1]);
    const refused = (d.summary as Record<string, unknown>).refused as number;
    if (refused) rows.push(['refused busy (engine count)', refused]);
    table.replaceChildren();
    if (!rows.length) {
      table.append(el('tr', {}, ''));
      (table.rows[0] as HTMLTableRowElement).append(el('td', {}, 'No errors in this window.'));
      return;
    }
    for (const [kind, n] of rows) {
      const tr = el('tr');
      tr.append(el('td', {}, kind), el('td', { class: 'num' }, String(n)));
      table.append(tr);
    }
  }

  renderSlowest(rows: SlowRow[]): void {
    const table = this.root.querySelector('#ld-slowest table') as HTMLTableElement;
    const head = el('tr');
    for (const h of ['finished', 'source', 'user', 'conv', 'e2e s', 'breakdown', 'queue ms', 'prefill ms', 'decode ms', 'network ms', 'TTFT ms', 'ITL p99 ms', 'prompt / cached / out', 'preempt', 'finish', 'worker']) {
      head.append(el('th', {}, h));
    }
    table.replaceChildren(head);
    for (const r of rows) {
      const tr = el('tr', { 'data-request': r.request_id });
      const total = (r.queue ?? 0) + (r.prefill ?? 0) + (r.decode ?? 0) + (r.network ?? 0) || 1;
      const bar = el('div', { class: 'ld-breakdown' });
      for (const [k, v] of [['queue', r.queue], ['prefill', r.prefill], ['decode', r.decode], ['network', r.network]] as const) {
        const seg = el('span', { class: `seg-${k}`, title: `${k} ${fmt(v, 1000, 0)} ms` });
        seg.style.width = `${(100 * (v ?? 0)) / total}%`;
        bar.append(seg);
      }
      const cells = [
        new Date(r.finished_at).toLocaleTimeString(), r.source, r.user, r.conversation_id == null ? '' : String(r.conversation_id),
        fmt(r.e2e, 1, 2),
      ];
      for (const c of cells) tr.append(el('td', {}, c));
      const barCell = el('td');
      barCell.append(bar);
      tr.append(barCell);
      for (const v of [r.queue, r.prefill, r.decode, r.network, r.ttft, r.itl_p99]) tr.append(el('td', { class: 'num' }, fmt(v, 1000, 0)));
      tr.append(el('td', { class: 'num' }, `${r.prompt_tokens} / ${r.cached_tokens} / ${r.output_tokens}`));
      tr.append(el('td', { class: 'num' }, String(r.preemptions)));
      tr.append(el('td', {}, r.error_code ? `${r.finish_reason} (${r.error_code})` : r.finish_reason));
      tr.append(el('td', { class: 'ld-muted' }, r.worker));
      table.append(tr);
    }
    if (!rows.length) {
      const tr = el('tr');
      tr.append(el('td', { colspan: '16' }, 'No requests in this window.'));
      table.append(tr);
    }
  }

  renderBench(runs: BenchRun[]): void {
    const box = this.root.querySelector('#ld-bench-runs') as HTMLElement;
    const keys: [string, string, number][] = [
      ['single_decode_tok_s', 'single-stream tok/s', 1], ['single_ttft_s', 'single TTFT ms', 1000],
      ['streams16_tok_s', '16 streams tok/s', 1], ['streams64_tok_s', '64 streams tok/s', 1],
      ['busy_ttft_ratio_p99', 'TTFT p99 busy/alone', 1], ['busy_itl_ratio', 'ITL p99 during prefill / median', 1],
      ['targets_met', 'targets met', 1],
    ];
    const table = el('table', { class: 'ld-table' });
    const head = el('tr');
    head.append(el('th', {}, 'run'), el('th', {}, 'status'), el('th', {}, 'started'));
    for (const [, label] of keys) head.append(el('th', {}, label));
    head.append(el('th', {}, 'plot'));
    table.append(head);
    for (const run of runs) {
      const tr = el('tr', { 'data-run': String(run.id) });
      const statusCell = el('td', { class: `st-${run.status}` }, run.status);
      if (run.cancel_url) statusCell.append(' ', this.cancelButton(run.cancel_url));
      tr.append(el('td', {}, `#${run.id}`), statusCell, el('td', {}, new Date(run.created_at).toLocaleString()));
      for (const [k, , scale] of keys) {
        const v = run.summary[k];
        tr.append(el('td', { class: 'num' }, k === 'targets_met' && v != null ? `${v} / ${run.summary.targets}` : fmt(v, scale, 2)));
      }
      const plotCell = el('td');
      if (run.plot_url) {
        const a = el('a', { href: run.plot_url, target: '_blank' });
        a.append(el('img', { src: run.plot_url, alt: `plot of run ${run.id}`, class: 'ld-thumb' }));
        plotCell.append(a);
      }
      tr.append(plotCell);
      table.append(tr);
      if (run.log_tail) {
        const logRow = el('tr');
        const td = el('td', { colspan: String(keys.length + 4) });
        td.append(el('pre', { class: 'ld-log' }, run.log_tail));
        logRow.append(td);
        table.append(logRow);
      }
    }
    box.replaceChildren(runs.length ? table : el('p', { class: 'ld-help' }, 'No runs yet.'));
  }

  async refreshFeedback(): Promise<void> {
    const box = this.root.querySelector('#ld-feedback-body') as HTMLElement;
    let f: FeedbackSummary;
    try {
      f = await request<FeedbackSummary>('GET', '/api/feedback/');
    } catch (err) {
      box.replaceChildren(el('p', { class: 'ld-help' }, `Could not load the feedback: ${(err as Error).message}`));
      return;
    }
    const counts = el('table', { class: 'ld-table', 'data-testid': 'feedback-counts' });
    const head = el('tr');
    head.append(el('th', {}, 'model'), el('th', {}, 'up'), el('th', {}, 'down'), el('th', {}, 'share up'));
    counts.append(head);
    for (const m of f.models) {
      const tr = el('tr');
      const total = m.up + m.down;
      tr.append(el('td', {}, m.model), el('td', { class: 'num' }, String(m.up)), el('td', { class: 'num' }, String(m.down)),
        el('td', { class: 'num' }, total ? `${Math.round((100 * m.up) / total)}%` : '–'));
      counts.append(tr);
    }
    const recent = el('table', { class: 'ld-table', 'data-testid': 'feedback-recent' });
    const rhead = el('tr');
    rhead.append(el('th', {}, 'when'), el('th', {}, 'rating'), el('th', {}, 'comment'), el('th', {}, 'reply'), el('th', {}, 'model'), el('th', {}, 'conversation'));
    recent.append(rhead);
    for (const r of f.recent) {
      const tr = el('tr', { 'data-message-id': String(r.message_id), 'data-rating': r.rating });
      tr.append(el('td', {}, r.at ? new Date(r.at).toLocaleString() : ''), el('td', {}, r.rating),
        el('td', {}, r.comment), el('td', { class: 'ld-muted' }, r.reply), el('td', {}, r.model || ''), el('td', {}, String(r.conversation_id)));
      recent.append(tr);
    }
    box.replaceChildren(...(f.recent.length ? [counts, el('h3', {}, 'Newest'), recent] : [el('p', { class: 'ld-help' }, 'No feedback yet.')]));
  }

  async startBenchmark(): Promise<void> {
    await this.post(this.benchUrl, this.root.querySelector('#ld-bench-start') as HTMLButtonElement);
  }
}

const root = document.getElementById('latency-dashboard');
if (root) new Dashboard(root);
