import { useEffect, useLayoutEffect, useRef, useState } from 'preact/hooks';
import { useChat } from './hooks';

const MAX_HEIGHT = 220;

export function Composer() {
  const { conversations, protocol, ui } = useChat();
  const key = conversations.currentKey.value;
  const draftRestored = ui.draftRestored.value;
  const conn = ui.conn.value;
  const streaming = conversations.streamingIn(key);
  const busy = conversations.isBusy(key);
  const [text, setText] = useState(() => ui.getDraft(key));
  const ta = useRef<HTMLTextAreaElement>(null);

  useEffect(() => {
    setText(ui.getDraft(key));
    ta.current?.focus();
  }, [key, draftRestored]);

  useLayoutEffect(() => {
    const el = ta.current;
    if (!el) return;
    el.style.height = 'auto';
    el.style.height = Math.min(MAX_HEIGHT, el.scrollHeight) + 'px';
  }, [text]);

  const send = () => {
    if (!text.trim()) return;
    const r = protocol.sendMessage(text);
    if (r.ok) setText('');
  };

  const online = conn === 'open';
  // Why Send is off while the socket is down; the same words as the line above the box.
  const offlineReason =
    conn === 'unauthorized' ? 'You are signed out.' : conn === 'connecting' ? 'Connecting…' : 'You are offline: messages can be sent again once the connection is back.';
  return (
    <form
      class="composer"
      data-testid="composer"
      onSubmit={(e) => {
        e.preventDefault();
        send();
      }}
    >
      {!online ? (
        <div class="composer-offline" id="composer-offline" data-testid="composer-offline" role="status">
          {conn === 'unauthorized' ? (
            <span>You are signed out. <a href="/accounts/login/">Sign in again</a>.</span>
          ) : conn === 'connecting' ? (
            'Connecting…'
          ) : (
            'Connection lost — reconnecting… Messages cannot be sent until it is back.'
          )}
        </div>
      ) : null}
      <div class="composer-box">
        <textarea
          ref={ta}
          id="composer-input"
          data-testid="composer-input"
          aria-label="Message"
          placeholder="Message"
          rows={1}
          value={text}
          onInput={(e) => {
            const v = (e.target as HTMLTextAreaElement).value;
            setText(v);
            ui.setDraft(key, v);
          }}
          onKeyDown={(e) => {
            if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && (e as KeyboardEvent).keyCode !== 229) {
              e.preventDefault();
              send();
            }
          }}
        />
        {streaming ? (
          <button type="button" class="btn stop" data-testid="stop-button" aria-label="Stop generating" onClick={() => protocol.stop()}>
            <span class="stop-square" aria-hidden="true" /> Stop
          </button>
        ) : (
          <button
            type="submit"
            class="btn primary send"
            data-testid="send-button"
            aria-label="Send message"
            data-online={online ? 'true' : 'false'}
            title={online ? undefined : offlineReason}
            aria-describedby={online ? undefined : 'composer-offline'}
            disabled={!online || !text.trim() || busy}
          >
            Send
          </button>
        )}
      </div>
      <div class="composer-hint">Enter to send · Shift+Enter for a new line · Esc stops · Ctrl+Shift+O new chat</div>
    </form>
  );
}
