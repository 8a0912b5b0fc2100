import { signal, type ReadonlySignal } from '@preact/signals';
import type { ChatLimits } from './limits';
import type { EngineInfo } from './types';

export interface ServerInfoPort {
  engine(): Promise<EngineInfo>;
  /** GET /api/chat/limits/; optional so a port without it falls back to FALLBACK_LIMITS. */
  limits?(): Promise<ChatLimits>;
}

/** What the server says about itself: the engine (model, context) and the settings limits. */
export class ServerInfo {
  private readonly _engine = signal<EngineInfo | null>(null);
  private readonly _limits = signal<ChatLimits | null>(null);
  readonly engine: ReadonlySignal<EngineInfo | null> = this._engine;
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

  async loadLimits(): Promise<void> {
    if (!this.api.limits) return;
    try {
      this._limits.value = await this.api.limits();
    } catch {
      /* FALLBACK_LIMITS stay in use; the server still checks every value */
    }
  }
}
