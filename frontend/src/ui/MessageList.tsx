import { useCallback, useEffect, useLayoutEffect, useMemo, useRef, useState } from 'preact/hooks';
import { copyText } from './clipboard';
import { useChat } from './hooks';
import { MessageView, type MessageActions } from './MessageView';
import { isPaused, pausedWords } from '../paused';

/** Within this many pixels of the bottom counts as "at the bottom". */
const STICK_PX = 48;

export function MessageList() {
  const { conversations, protocol, ui } = useChat();
  const key = conversations.currentKey.value;
  const thread = conversations.thread(key);
  const messages = conversations.messages.value;
  const currentId = conversations.currentId.value;
  const loading = currentId != null && conversations.isLoading(currentId) && !conversations.isLoaded(currentId);
  const notices = ui.noticesFor(key);
  const busy = conversations.isBusy(key);
  const comparing = currentId != null ? protocol.comparisons.value.get(currentId) : undefined;
  const figures = ui.showFigures.value;
  const conn = ui.conn.value;
  const scroller = useRef<HTMLDivElement>(null);
  const inner = useRef<HTMLDivElement>(null);
  const stick = useRef(true);
  const lastTop = useRef(0);
  const [atBottom, setAtBottom] = useState(true);

  const actions: MessageActions = useMemo(
    () => ({
      regenerate: (id) => {
        stick.current = true;
        protocol.regenerate(id);
      },
      edit: (id, text) => {
        stick.current = true;
        return protocol.edit(id, text).ok;
      },
      continueReply: (id) => {
        stick.current = true;
        protocol.continueReply(id);
      },
      alternative: (id, d) => void conversations.showAlternative(id, d),
      feedback: async (id, rating, comment) => (await conversations.giveFeedback(id, rating, comment)).ok,
    }),
    [conversations, protocol],
  );

  const toBottom = useCallback(() => {
    const el = scroller.current;
    if (el) {
      el.scrollTop = el.scrollHeight;
      lastTop.current = el.scrollTop;
    }
  }, []);

  // New conversation shown, or the reader sent something: follow the bottom again.
  useLayoutEffect(() => {
    stick.current = true;
    setAtBottom(true);
    toBottom();
  }, [key]);
  const lastId = thread[thread.length - 1];
  const lastRole = lastId != null ? messages.get(lastId)?.role : undefined;
  useLayoutEffect(() => {
    if (lastRole === 'user') stick.current = true;
  }, [lastId]);

  // Content grew (a delta, a new message, a highlighted block): keep the bottom in view if we follow it.
  useLayoutEffect(() => {
    if (stick.current) toBottom();
  });
  useEffect(() => {
    if (typeof ResizeObserver === 'undefined' || !inner.current) return;
    const ro = new ResizeObserver(() => {
      if (stick.current) toBottom();
    });
    ro.observe(inner.current);
    return () => ro.disconnect();
  }, []);

  const onScroll = () => {
    const el = scroller.current!;
    const gap = el.scrollHeight - el.scrollTop - el.clientHeight;
    const movedUp = el.scrollTop < lastTop.current - 2;
    lastTop.current = el.scrollTop;
    // Only the reader moving up lets go of the bottom, however little (a touchpad's small
    // steps and a smooth scroll's first frames stay within STICK_PX: treating those as "at
    // the bottom" let the next delta pull the view back down). Content growing under us never
    // moves the view up; content shrinking does, but leaves it at the very bottom.
    if (movedUp && gap > 2) stick.current = false;
    else if (gap <= STICK_PX) stick.current = true;
    const shown = stick.current;
    if (shown !== atBottom) setAtBottom(shown);
  };
  const onWheel = (e: WheelEvent) => {
    if (e.deltaY < 0) {
      stick.current = false;
      setAtBottom(false);
    }
  };

  // Copy buttons inside rendered code blocks.
  const onClick = async (e: MouseEvent) => {
    const btn = (e.target as HTMLElement).closest?.('.copy-code') as HTMLButtonElement | null;
    if (!btn) return;
    const code = btn.closest('.code-block')?.querySelector('code');
    if (code && (await copyText(code.textContent || ''))) {
      btn.textContent = 'Copied';
      btn.dataset.copied = 'true';
      setTimeout(() => {
        btn.textContent = 'Copy';
        delete btn.dataset.copied;
      }, 1500);
    }
  };

  return (
    <div class="messages-wrap">
      <div class="messages" ref={scroller} onScroll={onScroll} onWheel={onWheel} onClick={onClick} data-testid="message-list">
        <div class="messages-inner" ref={inner}>
          {thread.length === 0 && !loading ? (
            <div class="empty" data-testid="empty-state">
              <h2>What can I help with?</h2>
              <p>Type a message below. Enter sends, Shift+Enter adds a new line.</p>
            </div>
          ) : null}
          {loading ? <div class="loading" data-testid="loading">Loading…</div> : null}
          {currentId != null && conversations.hasOlder(currentId) ? (
            <button type="button" class="load-older" data-testid="load-older" disabled={conversations.isLoading(currentId)} onClick={() => void conversations.loadOlder(currentId)}>
              Load older messages
            </button>
          ) : null}
          {thread.map((id, i) => {
            const m = messages.get(id);
            const second = comparing && comparing.first === id ? messages.get(comparing.second) : undefined;
            if (m && second && currentId != null) {
              const writing = m.status === 'streaming' || second.status === 'streaming';
              return (
                <section key={id} class="compare" data-testid="compare" aria-label="Two answers to compare">
                  <p class="compare-note muted">{writing ? 'Two models are answering…' : 'Keep the answer to go on with; the other stays as an alternative (‹ ›).'}</p>
                  <div class="compare-cols">
                    {[m, second].map((x) => (
                      <div class="compare-col" data-testid="compare-col" data-model={x.model || ''} key={x.id}>
                        <div class="compare-model">{x.model}</div>
                        <MessageView m={x} busy={true} actions={actions} figures={figures} paused={isPaused(x, conn) ? pausedWords(conn) : undefined} />
                        <button type="button" class="btn small primary" data-testid="compare-keep" disabled={writing} onClick={() => void protocol.keepCompared(currentId, x.id)}>
                          Keep this answer
                        </button>
                      </div>
                    ))}
                  </div>
                </section>
              );
            }
            return m ? <MessageView key={id} m={m} busy={busy} actions={actions} figures={figures} last={i === thread.length - 1} paused={isPaused(m, conn) ? pausedWords(conn) : undefined} /> : null;
          })}
          {notices.map((n) => (
            <div class="notice" role="alert" data-testid="chat-error" data-code={n.code || ''} key={n.id}>
              <span>{n.text}</span>
              <button type="button" class="icon-btn" aria-label="Dismiss" data-testid="chat-error-dismiss" onClick={() => ui.dismiss(n.id)}>×</button>
            </div>
          ))}
        </div>
      </div>
      {!atBottom && thread.length > 0 ? (
        <button
          type="button"
          class="scroll-bottom"
          data-testid="scroll-bottom"
          aria-label="Scroll to the latest message"
          onClick={() => {
            stick.current = true;
            setAtBottom(true);
            toBottom();
          }}
        >
          ↓
        </button>
      ) : null}
    </div>
  );
}
