import { useChat } from './hooks';

/**
 * The model of the conversation on screen (the new chat's before its first send). A pick is
 * remembered on the conversation (PATCH) and every turn names it; a model that is no longer
 * served stays shown, marked, until another is picked.
 */
export function ModelPicker() {
  const { conversations, server, ui } = useChat();
  const id = conversations.currentId.value;
  const listed = server.models.value?.models ?? [];
  const served = listed.map((m) => m.id);
  // The option's tooltip: what the server says the model's files hold.
  const about = (id: string) => {
    const m = listed.find((x) => x.id === id);
    const context = m?.context_tokens ? `${m.context_tokens.toLocaleString('en-US')} tokens of context` : null;
    return [m?.architecture, m?.weight_format, context].filter(Boolean).join(' · ') || undefined;
  };
  const current = conversations.modelOf(id, server.defaultModel.value) ?? '';
  const options = current && !served.includes(current) ? [...served, current] : served;

  const pick = async (e: Event) => {
    const model = (e.target as HTMLSelectElement).value;
    const r = await conversations.setModel(id, model);
    if (!r.ok) ui.notify(id ?? 'new', r.error || 'Could not change the model.', 'model_not_found');
  };

  return (
    <label class="model-picker" title="The model that answers in this conversation">
      <span class="sr-only">Model</span>
      <select data-testid="model-picker" value={current} disabled={!current || options.length === 0} onChange={pick}>
        {options.map((m) => (
          <option key={m} value={m} title={about(m)}>
            {served.includes(m) ? m : `${m} (not served)`}
          </option>
        ))}
      </select>
    </label>
  );
}

/**
 * Compare: the next message is also answered by a second served model, side by side. Shown only
 * where the server serves more than one model.
 */
export function ComparePicker() {
  const { conversations, server, protocol } = useChat();
  const id = conversations.currentId.value;
  const served = (server.models.value?.models ?? []).map((m) => m.id);
  const current = conversations.modelOf(id, server.defaultModel.value) ?? '';
  const others = served.filter((m) => m !== current);
  const chosen = protocol.compareWith.value;
  // Nothing to compare with: no control, rather than one that cannot work (it would also take
  // a phone header's room).
  if (others.length === 0) return null;
  return (
    <label class="model-picker compare-picker" title="Answer your next message with a second model too, side by side">
      <span class="sr-only">Compare with</span>
      <select
        data-testid="compare-picker"
        value={chosen && others.includes(chosen) ? chosen : ''}
        onChange={(e) => (protocol.compareWith.value = (e.target as HTMLSelectElement).value || null)}
      >
        <option value="">Compare: off</option>
        {others.map((m) => (
          <option key={m} value={m}>
            Compare with {m}
          </option>
        ))}
      </select>
    </label>
  );
}
