import { request } from './api';

/** The formats of "export all": a zip of Markdown files, one JSON file, or plain-text files. */
export type ExportFormat = 'md' | 'json' | 'txt';

/** An export job (docs/http.md, "Exports"). */
export interface ExportJob {
  id: number;
  status: 'queued' | 'running' | 'done' | 'failed' | 'cancelled';
  format: ExportFormat;
  created_at: string;
  finished_at: string | null;
  download: string | null;
}

export interface ExportsPort {
  start(format: ExportFormat): Promise<ExportJob>;
  list(): Promise<{ exports: ExportJob[] }>;
}

export const exportsApi: ExportsPort = {
  start: (format) => request('POST', '/api/exports/', { format }),
  list: () => request('GET', '/api/exports/'),
};

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Export all of the user's conversations: start the job and wait for it to end (it runs on
 * the server, in the background). `onUpdate` hears each state; the end state is returned.
 */
export async function exportAll(
  format: ExportFormat,
  onUpdate: (job: ExportJob) => void = () => undefined,
  api: ExportsPort = exportsApi,
  { everyMs = 800, timeoutMs = 5 * 60_000 } = {},
): Promise<ExportJob> {
  let job = await api.start(format);
  onUpdate(job);
  const until = Date.now() + timeoutMs;
  while ((job.status === 'queued' || job.status === 'running') && Date.now() < until) {
    await sleep(everyMs);
    const found = (await api.list()).exports.find((j) => j.id === job.id);
    if (found) {
      job = found;
      onUpdate(job);
    }
  }
  return job;
}
