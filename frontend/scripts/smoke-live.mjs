// Smoke test against a running server, no browser needed: logs in, loads the real page `/`
// and the built dist/app.js into jsdom with a real WebSocket, then sends, streams, regenerates,
// stops with Esc, flips alternatives, drops the socket mid-reply and checks the reply resumes.
//   npm run build && BASE=http://127.0.0.1:8000 CHAT_USER=alice CHAT_PASSWORD=... node scripts/smoke-live.mjs
import fs from 'node:fs';
import { JSDOM } from 'jsdom';
import WS from 'ws';
const BASE = process.env.BASE || 'http://127.0.0.1:8000';
const USER = process.env.CHAT_USER || 'alice';
const PASSWORD = process.env.CHAT_PASSWORD || '';
const here = new URL('..', import.meta.url).pathname;
const cookies = {};
const ck = () => Object.entries(cookies).map(([k, v]) => `${k}=${v}`).join('; ');
const keep = (r) => { for (const c of r.headers.getSetCookie?.() || []) { const [kv] = c.split(';'); const i = kv.indexOf('='); cookies[kv.slice(0, i)] = kv.slice(i + 1); } };
let r = await fetch(BASE + '/accounts/login/'); keep(r);
const token = /name="csrfmiddlewaretoken" value="([^"]+)"/.exec(await r.text())[1];
r = await fetch(BASE + '/accounts/login/', { method: 'POST', redirect: 'manual', headers: { 'Content-Type': 'application/x-www-form-urlencoded', Cookie: ck(), Referer: BASE + '/accounts/login/' }, body: new URLSearchParams({ username: USER, password: PASSWORD, csrfmiddlewaretoken: token }) }); keep(r);
if (r.status !== 302) throw new Error('login failed (' + r.status + '): check CHAT_USER / CHAT_PASSWORD');
r = await fetch(BASE + '/', { headers: { Cookie: ck() } });
const html = await r.text();
const dom = new JSDOM(html, { url: BASE + '/', pretendToBeVisual: true, runScripts: 'outside-only' });
const w = dom.window;
for (const [k, v] of Object.entries(cookies)) if (k === 'csrftoken') w.document.cookie = `${k}=${v}`;
let lastWs;
w.WebSocket = class extends WS { constructor(u) { super(u, { headers: { Cookie: ck(), Origin: BASE } }); lastWs = this; } };
w.fetch = (path, opts = {}) => fetch(new URL(path, BASE), { ...opts, headers: { ...(opts.headers || {}), Cookie: ck(), Origin: BASE, Referer: BASE + '/' } });
w.matchMedia = () => ({ matches: false, addEventListener() {}, removeEventListener() {} });
w.eval(fs.readFileSync(here + 'dist/app.js', 'utf8'));
const d = w.document;
const $ = (s) => d.querySelector(`[data-testid="${s}"]`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(f, ms = 60000) { const t = Date.now(); while (!f()) { if (Date.now() - t > ms) throw new Error('timeout: ' + f); await sleep(20); } }
await until(() => $('connection-status')?.dataset.state === 'open', 5000);
console.log('connected; sidebar items', d.querySelectorAll('[data-testid="conversation-item"]').length);
const ta = $('composer-input');
ta.value = 'Give me a python hello world in a code block.';
ta.dispatchEvent(new w.Event('input', { bubbles: true }));
await sleep(50);
ta.dispatchEvent(new w.KeyboardEvent('keydown', { key: 'Enter', bubbles: true, cancelable: true }));
await until(() => d.querySelector('[data-role="assistant"][data-status="streaming"]'));
const lens = [];
const reply = () => d.querySelector('[data-role="assistant"]:last-of-type') || [...d.querySelectorAll('[data-role="assistant"]')].at(-1);
await until(() => { const t = reply().querySelector('[data-testid="message-content"]').textContent.length; if (lens.at(-1) !== t) lens.push(t); return reply().dataset.status !== 'streaming'; }, 120000);
console.log('growth steps', lens.length, lens.slice(0, 12).join(','), '…', lens.at(-1));
console.log('client ttft ms', reply().dataset.clientTtftMs, 'status', reply().dataset.status);
console.log('stats:', reply().querySelector('[data-testid="message-stats"]').textContent);
console.log('has code block', !!reply().querySelector('.code-block pre code'), 'hash', w.location.hash, 'title', $('conversation-title').textContent);
console.log('items', [...d.querySelectorAll('[data-testid="conversation-item"]')].map((e) => e.dataset.conversationId + ':' + e.textContent.slice(0, 30)).slice(0, 3));
// regenerate + stop via Esc
reply().querySelector('[data-testid="message-regenerate"]').click();
await until(() => d.querySelector('[data-role="assistant"][data-status="streaming"]') && reply().querySelector('[data-testid="message-content"]').textContent.length > 3);
w.dispatchEvent(new w.KeyboardEvent('keydown', { key: 'Escape', bubbles: true }));
await until(() => reply().dataset.status !== 'streaming');
console.log('after Esc', reply().dataset.status, 'alts', $('alt-counter')?.textContent);
$('alt-prev').click();
await until(() => $('alt-counter')?.textContent === '1/2', 5000);
console.log('flipped to', $('alt-counter').textContent, reply().dataset.status);
// drop the socket mid-reply, see it resume
ta.value = 'Count from 1 to 30, one number per line.';
ta.dispatchEvent(new w.Event('input', { bubbles: true }));
await sleep(30);
$('send-button').click();
await until(() => d.querySelector('[data-role="assistant"][data-status="streaming"]') && reply().querySelector('[data-testid="message-content"]').textContent.length > 4);
const before = reply().querySelector('[data-testid="message-content"]').textContent.length;
lastWs.terminate();
await sleep(100);
console.log('during drop:', $('connection-status').dataset.state);
await until(() => $('connection-status').dataset.state === 'open', 10000);
await until(() => reply().querySelector('[data-testid="message-content"]').textContent.length > before + 3, 30000);
console.log('resumed, grew from', before, 'to', reply().querySelector('[data-testid="message-content"]').textContent.length);
$('stop-button').click();
await until(() => reply().dataset.status !== 'streaming');
console.log('stopped', reply().dataset.status, 'errors', [...d.querySelectorAll('[data-testid="chat-error"],[data-testid="toast"]')].map((e) => e.textContent));
if (d.querySelector('[data-testid="chat-error"],[data-testid="toast"]')) process.exitCode = 1;
console.log(process.exitCode ? 'SMOKE FAILED' : 'SMOKE OK');
w.close();
process.exit(process.exitCode || 0);
