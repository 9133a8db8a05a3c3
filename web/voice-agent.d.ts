// Types for voice-agent.js (served beside it at /sdk/voice-agent.d.ts).

export declare const CALLS_PATH: '/v1/realtime/calls';

export type AgentState = 'connecting' | 'listening' | 'thinking' | 'speaking' | 'disconnected';
export declare const STATES: readonly AgentState[];

export type ErrorCode =
  | 'microphone_denied'
  | 'microphone_not_found'
  | 'microphone_unavailable'
  | 'microphone_error'
  | 'server_unreachable'
  | 'server_full'
  | 'not_ready'
  | 'shutting_down'
  | 'server_unavailable'
  | 'call_refused'
  | 'ice_failed'
  | 'timeout'
  | 'call_ended'
  | 'autoplay_blocked'
  | 'not_connected'
  | 'already_connected'
  | 'cancelled'
  | 'invalid_text'
  | (string & {}); // codes of the server's `error` events pass through

export declare class VoiceAgentError extends Error {
  readonly name: 'VoiceAgentError';
  readonly code: ErrorCode;
  /** HTTP status when the server refused the call. */
  readonly status?: number;
  /** Seconds from the server's Retry-After header (e.g. when it is full). */
  readonly retryAfter?: number;
  /** The call is over (or never started) because of this error. */
  readonly fatal: boolean;
  /** The server's `error` event, when it came from one. */
  readonly event?: RealtimeServerEvent;
  constructor(code: ErrorCode, message: string, extra?: { status?: number; retryAfter?: number; fatal?: boolean; event?: RealtimeServerEvent });
}

export interface TurnDetection {
  /** Silence that ends the user's turn (server accepts 100-5000). */
  silenceDurationMs?: number;
  threshold?: number;
  prefixPaddingMs?: number;
}

export interface SessionOptions {
  instructions?: string;
  voice?: string;
  /** Speaking rate, if the server supports it. */
  speed?: number;
  turnDetection?: TurnDetection;
}

/** One of the server's voices (`GET /v1/voices`), for `SessionOptions.voice`. */
export interface Voice {
  name: string;
  /** The TTS backend that speaks it: piper, openai, coqui. */
  backend: string;
  /** The voice a session speaks with until it chooses another. */
  default: boolean;
  sample_rate: number;
}

export interface ReconnectOptions {
  /** Retries after a failed connect or a lost call (default 3). */
  attempts?: number;
  /** Pause between retries when the server gives no Retry-After (default 1000). */
  delayMs?: number;
}

export interface ConnectOptions {
  /** Base URL of the service, e.g. "https://voice.example" (default: this page's origin). */
  url?: string;
  /** Sent as `Authorization: Bearer <token>`. */
  token?: string;
  /** getUserMedia audio constraints (echo cancellation, noise suppression and gain
   * control default to on), e.g. { deviceId: { exact: id } }; or a MediaStream the
   * app owns (it is not stopped on disconnect). */
  microphone?: MediaTrackConstraints | MediaStream;
  /** Element that plays the assistant; default: a new Audio(); null: play `remoteStream` yourself. */
  audio?: HTMLAudioElement | null;
  /** Reject connect() when audio has not flowed after this long (default 15000). */
  connectTimeoutMs?: number;
  /** Retry a failed connect (full or unreachable server, ICE failure) and reconnect a lost call. */
  reconnect?: boolean | ReconnectOptions;
  iceServers?: RTCIceServer[];
  /** Handlers subscribed before connecting, so no event is missed. */
  on?: Partial<{ [K in keyof VoiceAgentEvents]: (event: VoiceAgentEvents[K]) => void }>;
}

export interface ServerLatency {
  /** From the user's last voiced audio to the first reply audio leaving the server. */
  voiceToVoiceMs?: number;
  endOfTurnMs?: number;
  sttMs?: number;
  llmTtftMs?: number;
  ttsFirstAudioMs?: number;
  serverOverheadMs?: number;
}

export type ResponseStatus = 'completed' | 'cancelled' | 'failed' | 'incomplete';

export interface VoiceAgentEvents {
  state: { state: AgentState; previous: AgentState };
  session: { session: Record<string, unknown> };
  speechstart: { itemId: string; audioStartMs: number };
  speechstop: { itemId: string; audioEndMs: number };
  /** Partial user transcript while speaking; `text` is everything so far. */
  userpartial: { itemId: string; delta: string; text: string };
  /** Final user transcript ("" when only noise was heard). */
  usertranscript: { itemId: string; text: string };
  responsestart: { responseId: string };
  /** Assistant transcript delta; `text` is the reply so far. */
  assistantdelta: { responseId: string; itemId: string; delta: string; text: string };
  /** The reply ended; when interrupted, `text` is what the user actually heard. */
  assistantdone: { responseId: string; itemId: string | null; text: string; status: ResponseStatus; reason?: string };
  /** Per turn: the server's spans plus the client's view (end of the user's
   * turn, or sendText, to the assistant's audio starting). */
  latency: { responseId: string; server?: ServerLatency; clientMs?: number };
  error: VoiceAgentError;
  reconnecting: { attempt: number; error: VoiceAgentError };
  /** Every raw server event (OpenAI Realtime GA schema). */
  event: RealtimeServerEvent;
}

export interface RealtimeServerEvent {
  type: string;
  event_id?: string;
  [key: string]: unknown;
}

export interface RealtimeClientEvent {
  type: string;
  event_id?: string;
  [key: string]: unknown;
}

export declare class VoiceAgent {
  constructor(options?: ConnectOptions);
  readonly state: AgentState;
  /** The peer connection while connected (for getStats). */
  readonly pc: RTCPeerConnection | null;
  readonly channel: RTCDataChannel | null;
  /** The microphone stream sent to the server. */
  readonly microphone: MediaStream | null;
  /** The assistant's audio. */
  readonly remoteStream: MediaStream | null;
  readonly muted: boolean;
  /** Every server event received on this agent, oldest first. */
  readonly events: RealtimeServerEvent[];
  on<K extends keyof VoiceAgentEvents>(type: K, fn: (event: VoiceAgentEvents[K]) => void): () => void;
  off<K extends keyof VoiceAgentEvents>(type: K, fn: (event: VoiceAgentEvents[K]) => void): void;
  /** Resolves once the call is up and the server's audio flows; rejects with a VoiceAgentError. */
  connect(): Promise<this>;
  mute(): void;
  unmute(): void;
  /** Cancel the reply in progress and cut the audio being played. */
  interrupt(): void;
  /** The voices the server has, the default first (no call needed). */
  voices(): Promise<Voice[]>;
  /** Resolves with the session the server now has (`session.updated`). */
  updateSession(options: SessionOptions): Promise<Record<string, unknown>>;
  /** A typed user message (`conversation.item.create` + `response.create`); a reply in
   * progress is cancelled first (`response.cancel`), as speaking over it would. */
  sendText(text: string): void;
  /** Send any Realtime client event. */
  send(event: RealtimeClientEvent): void;
  /** Microphone and assistant levels, 0..1. */
  getLevels(): Promise<{ input: number; output: number }>;
  /** Hang up: stops the microphone tracks, closes the peer, ends the call on the server. */
  disconnect(): void;
}

export declare function connect(options?: ConnectOptions): Promise<VoiceAgent>;

/** Pure pieces, exported for custom clients and tests. */
export declare function sessionUpdateEvent(options: SessionOptions): RealtimeClientEvent;
export declare function userTextEvents(text: string): RealtimeClientEvent[];
export declare function serverLatency(metadata: Record<string, string> | null | undefined): ServerLatency | undefined;

export declare class EventTracker {
  constructor(now?: () => number, state?: AgentState);
  state: AgentState;
  userSpeaking: boolean;
  activeResponseId: string | null;
  textSent(): void;
  handle(event: RealtimeServerEvent): Array<[keyof VoiceAgentEvents, unknown]>;
}
