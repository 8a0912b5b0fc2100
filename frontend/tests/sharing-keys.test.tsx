import { render } from 'preact';
import { act } from 'preact/test-utils';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ApiError } from '../src/api';
import { ApiKeys, keyNameProblem, type ApiKeyInfo, type KeysPort } from '../src/api-keys';
import { ConversationLink, SharedLinks, type ShareOptions, type SharedLink, type SharingPort } from '../src/sharing';
import { AccountDialog } from '../src/ui/AccountDialog';
import { ShareDialog } from '../src/ui/ShareDialog';
import { flush } from './fakes';

/** The server's sharing endpoints, in memory: one link per conversation, a new token after a revoke. */
class FakeSharing implements SharingPort {
  links_ = new Map<number, SharedLink>();
  serial = 0;
  changed = false;
  async link(id: number) {
    const l = this.links_.get(id);
    return { share: l ? { ...l, changed: this.changed } : null };
  }
  async publish(id: number, options: ShareOptions) {
    const old = this.links_.get(id);
    const token = old ? old.path.slice(7) : `token${++this.serial}`;
    const l: SharedLink = {
      url: `http://test/share/${token}`,
      path: `/share/${token}`,
      conversation_id: id,
      title: `Chat ${id}`,
      created_at: '2026-11-30T05:00:00Z',
      shared_at: '2026-11-30T06:00:00Z',
      message_count: 2,
      show_author: options.show_author ?? old?.show_author ?? false,
      show_settings: options.show_settings ?? old?.show_settings ?? false,
      changed: false,
    };
    this.links_.set(id, l);
    this.changed = false;
    return { share: l };
  }
  async unpublish(id: number) {
    if (!this.links_.delete(id)) throw new ApiError(404, 'not_found', 'Not found.');
  }
  async links() {
    return { shares: [...this.links_.values()].reverse() };
  }
}

class FakeKeys implements KeysPort {
  list: ApiKeyInfo[] = [];
  max = 2;
  async keys() {
    return { keys: [...this.list], max_keys: this.max };
  }
  async createKey(name: string) {
    if (this.list.length >= this.max) throw new ApiError(409, 'too_many_keys', `You already have ${this.max} API keys, the most one account may hold.`);
    const id = this.list.length + 1;
    const key = { id, name, prefix: `sk-chat-abc${id}`, created_at: '2026-11-30T05:00:00Z', last_used_at: null };
    this.list.unshift(key);
    return { key, secret: `sk-chat-abc${id}-secret` };
  }
  async revokeKey(id: number) {
    const before = this.list.length;
    this.list = this.list.filter((k) => k.id !== id);
    if (this.list.length === before) throw new ApiError(404, 'not_found', 'Not found.');
  }
}

describe('ConversationLink', () => {
  it('loads, shares, updates under the same address and revokes', async () => {
    const api = new FakeSharing();
    const state = new ConversationLink(api, 7);
    expect(state.link.value).toBeUndefined();
    await state.load();
    expect(state.link.value).toBeNull();
    expect(await state.publish({ show_author: true })).toBe(true);
    const first = state.link.value!;
    expect(first.show_author).toBe(true);
    expect(await state.publish({})).toBe(true);
    expect(state.link.value!.url).toBe(first.url);
    expect(state.link.value!.show_author).toBe(true);
    expect(await state.revoke()).toBe(true);
    expect(state.link.value).toBeNull();
    await state.publish({});
    expect(state.link.value!.url).not.toBe(first.url);
  });

  it('says in words why a step failed and keeps what it had', async () => {
    const api = new FakeSharing();
    api.publish = async () => {
      throw new ApiError(400, 'nothing_to_share', 'There is nothing to share yet: no finished message.');
    };
    const state = new ConversationLink(api, 1);
    await state.load();
    expect(await state.publish({})).toBe(false);
    expect(state.error.value).toBe('There is nothing to share yet: no finished message.');
    expect(state.link.value).toBeNull();
    expect(state.busy.value).toBe(false);
  });
});

describe('SharedLinks', () => {
  it('lists the links and drops a revoked one, even one already gone', async () => {
    const api = new FakeSharing();
    await api.publish(1, {});
    await api.publish(2, {});
    const state = new SharedLinks(api);
    await state.load();
    expect(state.list.value!.map((s) => s.conversation_id)).toEqual([2, 1]);
    expect(await state.revoke(2)).toBe(true);
    await api.unpublish(1); // revoked elsewhere meanwhile
    expect(await state.revoke(1)).toBe(true);
    expect(state.list.value).toEqual([]);
    expect(state.error.value).toBe('');
  });
});

describe('ApiKeys', () => {
  it('keeps a new key only until it is forgotten and lists it by prefix', async () => {
    const state = new ApiKeys(new FakeKeys());
    await state.load();
    expect(state.list.value).toEqual([]);
    expect(state.maxKeys.value).toBe(2);
    expect(await state.create('  laptop  ')).toBe(true);
    expect(state.created.value!.secret).toBe('sk-chat-abc1-secret');
    expect(state.list.value!.map((k) => k.name)).toEqual(['laptop']);
    state.forget();
    expect(state.created.value).toBeNull();
    expect(JSON.stringify(state.list.value)).not.toContain('secret');
  });

  it('refuses a name before sending and reports the cap in the server’s words', async () => {
    const api = new FakeKeys();
    const state = new ApiKeys(api);
    expect(await state.create('   ')).toBe(false);
    expect(state.error.value).toContain('Give the key a name');
    expect(api.list).toEqual([]);
    await state.create('a');
    await state.create('b');
    expect(await state.create('c')).toBe(false);
    expect(state.error.value).toBe('You already have 2 API keys, the most one account may hold.');
    expect(state.created.value).toBeNull();
    expect(await state.revoke(1)).toBe(true);
    expect(state.list.value!.map((k) => k.name)).toEqual(['b']);
  });

  it('names too long a name', () => {
    expect(keyNameProblem('x'.repeat(101))).toContain('at most 100');
    expect(keyNameProblem('ok')).toBe('');
  });
});

describe('the dialogs', () => {
  let root: HTMLElement;
  const $ = (id: string) => root.querySelector(`[data-testid="${id}"]`) as HTMLElement;
  /** Effects run as `act` ends: let what they started land. */
  const settle = () =>
    act(async () => {
      await flush();
    });
  const click = (id: string) =>
    act(async () => {
      $(id).click();
      await flush();
    });
  beforeEach(() => {
    root = document.createElement('div');
    document.body.appendChild(root);
  });
  afterEach(() => {
    render(null, root);
    root.remove();
  });

  it('Share: creates a link, asks before stopping, and closes on Escape without going further', async () => {
    const api = new FakeSharing();
    let closed = 0;
    let reachedPage = 0;
    const onPage = (e: KeyboardEvent) => e.key === 'Escape' && !e.defaultPrevented && reachedPage++;
    window.addEventListener('keydown', onPage);
    await act(async () => {
      render(<ShareDialog conversationId={3} username="alice" api={api} onClose={() => closed++} />, root);
      await flush();
    });
    await settle();
    expect($('share-create').textContent).toBe('Create link');
    expect($('share-url')).toBeNull();
    expect(root.textContent).toContain('My username (alice)');
    await click('share-create');
    expect(($('share-url') as HTMLInputElement).value).toBe('http://test/share/token1');
    expect($('share-create').textContent).toBe('Update link');
    await click('share-revoke');
    expect(document.activeElement).toBe($('share-revoke-cancel'));
    await click('share-revoke-confirm');
    expect(api.links_.size).toBe(0);
    expect($('share-status').textContent).toContain('no longer works');
    await act(() => {
      $('share-dialog').dispatchEvent(new KeyboardEvent('keydown', { key: 'Escape', bubbles: true }));
    });
    window.removeEventListener('keydown', onPage);
    expect(closed).toBe(1);
    expect(reachedPage).toBe(0);
  });

  it('Share: says the conversation changed since the link was made', async () => {
    const api = new FakeSharing();
    await api.publish(3, {});
    api.changed = true;
    await act(async () => {
      render(<ShareDialog conversationId={3} username="alice" api={api} onClose={() => undefined} />, root);
      await flush();
    });
    await settle();
    expect($('share-changed')).not.toBeNull();
    await click('share-create');
    expect($('share-changed')).toBeNull();
  });

  it('Account: shows a new key once, revokes after asking, and lists the links', async () => {
    const keys = new FakeKeys();
    const sharing = new FakeSharing();
    await sharing.publish(5, {});
    let closed = 0;
    await act(async () => {
      render(<AccountDialog keys={keys} sharing={sharing} onClose={() => closed++} />, root);
      await flush();
    });
    await settle();
    expect($('keys-empty')).not.toBeNull();
    expect(root.querySelectorAll('[data-testid=link-row]')).toHaveLength(1);
    await act(() => {
      const input = $('key-name') as HTMLInputElement;
      input.value = 'ci';
      input.dispatchEvent(new Event('input', { bubbles: true }));
    });
    await act(async () => {
      (root.querySelector('form.key-form') as HTMLFormElement).requestSubmit();
      await flush();
    });
    expect($('new-key-value').textContent).toBe('sk-chat-abc1-secret');
    expect(root.querySelectorAll('[data-testid=key-row]')).toHaveLength(1);
    await click('new-key-done');
    expect($('new-key')).toBeNull();
    expect(root.textContent).not.toContain('secret');
    await click('key-revoke');
    expect(document.activeElement).toBe($('key-revoke-cancel'));
    await click('key-revoke-cancel');
    expect(keys.list).toHaveLength(1);
    await click('key-revoke');
    await click('key-revoke-confirm');
    expect(keys.list).toHaveLength(0);
    expect($('account-status').textContent).toBe('Key “ci” revoked.');
    await click('link-revoke');
    await click('link-revoke-confirm');
    expect(sharing.links_.size).toBe(0);
    expect($('links-empty')).not.toBeNull();
    await click('account-close');
    expect(closed).toBe(1);
  });
});
