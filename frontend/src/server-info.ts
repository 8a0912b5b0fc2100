import { computed, signal, type ReadonlySignal } from '@preact/signals';
import type { ChatLimits } from './limits';
import type { EngineInfo, ModelsInfo } from './types';

export interface ServerInfoPort {
  engine(): Promise<EngineInfo>;
  /** GET /api/chat/limits/; optional so a port without it falls back to FALLBACK_LIMITS. */
  limits?(): Promise<ChatLimits>;
  /** GET /api/models/; optional so a port without it knows only the engine's model. */
  models?(): Promise<ModelsInfo>;
}

/** What the server says about itself: the engine (model, context) and the settings limits. */
export class ServerInfo {
  private readonly _engine = signal<EngineInfo | null>(null);
  private readonly _limits = signal<ChatLimits | null>(null);
  private readonly _models = signal<ModelsInfo | null>(null);
  readonly engine: ReadonlySignal<EngineInfo | null> = this._engine;
  /** The models a conversation can use (null until loaded). */
  readonly models: ReadonlySignal<ModelsInfo | null> = this._models;
  /** The model a new chat gets ('' until the server said). */
  readonly defaultModel: ReadonlySignal<string> = computed(() => this._models.value?.default || this._engine.value?.model || '');
  /** The server's settings limits (null until loaded; callers use FALLBACK_LIMITS meanwhile). */
  readonly limits: ReadonlySignal<ChatLimits | null> = this._limits;

  constructor(private readonly api: ServerInfoPort) {}

  /** The longest message the server takes, once either answer is in. */
  get maxMessageChars(): number | undefined {
    return this._limits.value?.message.max_chars ?? this._engine.value?.max_message_chars;
  }

  async loadEngine(): Promise<void> {
    try {
      this._engine.value = await this.api.engine();
    } catch {
      /* the settings dialog falls back to built-in defaults */
    }
  }

  async loadModels(): Promise<void> {
    if (!this.api.models) return;
    try {
      this._models.value = await this.api.models();
    } catch {
      /* the picker shows the conversation's model alone; the server still checks each turn */
    }
  }

  /** A model's context window in tokens, when the server knows it. */
  contextOf(model: string): number | null {
    return this._models.value?.models.find((m) => m.id === model)?.context_tokens ?? null;
  }

  async loadLimits(): Promise<void> {
    if (!this.api.limits) return;
    try {
      this._limits.value = await this.api.limits();
    } catch {
      /* FALLBACK_LIMITS stay in use; the server still checks every value */
    }
  }
}
