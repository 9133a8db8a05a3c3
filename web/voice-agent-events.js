// Voice agent browser SDK: the Realtime events, both ways. Client events
// are built here; the server's stream is turned into the SDK's typed events
// and the conversation state by EventTracker. Pure: no network, no DOM.
// Part of voice-agent.js, which re-exports what a page uses.

import { VoiceAgentError } from './voice-agent-errors.js';

// ---- client events (pure builders, exported for reuse and tests) -------------

let eventCounter = 0;
export function eventId() {
  eventCounter += 1;
  return `event_client_${Date.now().toString(36)}_${eventCounter}`;
}

/**
 * A `session.update` client event (GA Realtime schema).
 * @param {{instructions?: string, voice?: string, speed?: number,
 *          turnDetection?: {silenceDurationMs?: number, threshold?: number, prefixPaddingMs?: number}}} options
 */
export function sessionUpdateEvent(options) {
  const session = { type: 'realtime' };
  if (options.instructions !== undefined) session.instructions = options.instructions;
  const output = {};
  if (options.voice !== undefined) output.voice = options.voice;
  if (options.speed !== undefined) output.speed = options.speed;
  const turn = {};
  const td = options.turnDetection;
  if (td) {
    turn.type = 'server_vad';
    if (td.silenceDurationMs !== undefined) turn.silence_duration_ms = td.silenceDurationMs;
    if (td.threshold !== undefined) turn.threshold = td.threshold;
    if (td.prefixPaddingMs !== undefined) turn.prefix_padding_ms = td.prefixPaddingMs;
  }
  const audio = {};
  if (Object.keys(output).length) audio.output = output;
  if (td) audio.input = { turn_detection: turn };
  if (Object.keys(audio).length) session.audio = audio;
  return { type: 'session.update', event_id: eventId(), session };
}

/** A typed user message and the request to answer it. */
export function userTextEvents(text) {
  if (typeof text !== 'string' || !text.trim()) {
    throw new VoiceAgentError('invalid_text', 'sendText needs a non-empty string');
  }
  return [
    {
      type: 'conversation.item.create',
      event_id: eventId(),
      item: { type: 'message', role: 'user', content: [{ type: 'input_text', text }] },
    },
    { type: 'response.create', event_id: eventId() },
  ];
}

// ---- server events -> typed events and state ---------------------------------

const num = (v) => (v === undefined || v === null || v === '' ? undefined : Number(v));

/** Server latency spans from `response.done` `response.metadata` (strings in the schema). */
export function serverLatency(metadata) {
  if (!metadata || typeof metadata !== 'object') return undefined;
  const spans = {
    voiceToVoiceMs: num(metadata.voice_to_voice_ms),
    endOfTurnMs: num(metadata.end_of_turn_delay_ms),
    sttMs: num(metadata.stt_ms),
    llmTtftMs: num(metadata.llm_ttft_ms),
    ttsFirstAudioMs: num(metadata.tts_first_audio_ms),
    serverOverheadMs: num(metadata.server_overhead_ms),
  };
  return Object.values(spans).some((v) => v !== undefined) ? spans : undefined;
}

/**
 * Turns the server's event stream into the SDK's typed events and the
 * conversation state. Pure: no network, no DOM; `now` is injectable so the
 * client-side latency it measures can be checked.
 */
export class EventTracker {
  constructor(now = () => performance.now(), state = 'connecting') {
    this.now = now;
    this.state = state;
    this.userSpeaking = false;
    this.activeResponseId = null;
    this.speakingResponseId = null;
    this.partials = new Map(); // item_id -> partial transcript so far
    this.replies = new Map(); // response_id -> { text, audio, startedAt }
    this.turnStartedAt = null; // client time the user's turn ended (or text was sent)
  }

  /** The client sent a typed message: latency counts from now. */
  textSent() {
    this.turnStartedAt = this.now();
  }

  /**
   * @param {any} e a parsed server event
   * @returns {Array<[string, any]>} typed events to emit, in order
   */
  handle(e) {
    const out = [];
    const setState = (state) => {
      if (state === this.state) return;
      const previous = this.state;
      this.state = state;
      out.push(['state', { state, previous }]);
    };
    switch (e?.type) {
      case 'session.created':
        if (this.state === 'connecting') setState('listening');
        out.push(['session', { session: e.session }]);
        break;
      case 'session.updated':
        out.push(['session', { session: e.session }]);
        break;
      case 'input_audio_buffer.speech_started':
        this.userSpeaking = true;
        out.push(['speechstart', { itemId: e.item_id, audioStartMs: e.audio_start_ms }]);
        setState('listening'); // the user has the floor (the server interrupts any reply)
        break;
      case 'input_audio_buffer.speech_stopped':
        this.userSpeaking = false;
        this.turnStartedAt = this.now();
        out.push(['speechstop', { itemId: e.item_id, audioEndMs: e.audio_end_ms }]);
        setState('thinking');
        break;
      case 'conversation.item.input_audio_transcription.delta': {
        const text = (this.partials.get(e.item_id) ?? '') + (e.delta ?? '');
        this.partials.set(e.item_id, text);
        out.push(['userpartial', { itemId: e.item_id, delta: e.delta ?? '', text }]);
        break;
      }
      case 'conversation.item.input_audio_transcription.completed': {
        this.partials.delete(e.item_id);
        const text = (e.transcript ?? '').trim();
        out.push(['usertranscript', { itemId: e.item_id, text }]);
        // Nothing was said (noise): no reply will come.
        if (!text && this.state === 'thinking' && !this.activeResponseId) setState('listening');
        break;
      }
      case 'conversation.item.input_audio_transcription.failed':
        this.partials.delete(e.item_id);
        out.push(['error', new VoiceAgentError(e.error?.code || 'transcription_failed',
          e.error?.message || 'transcription failed', { event: e })]);
        if (this.state === 'thinking' && !this.activeResponseId) setState('listening');
        break;
      case 'response.created': {
        const id = e.response?.id;
        this.activeResponseId = id;
        this.replies.set(id, { text: '', audio: false, itemId: null });
        out.push(['responsestart', { responseId: id }]);
        if (this.state === 'listening' && !this.userSpeaking) setState('thinking');
        break;
      }
      case 'response.output_audio_transcript.delta':
      case 'response.output_text.delta': {
        const reply = this.reply(e.response_id);
        reply.text += e.delta ?? '';
        reply.itemId = e.item_id;
        out.push(['assistantdelta', {
          responseId: e.response_id, itemId: e.item_id, delta: e.delta ?? '', text: reply.text,
        }]);
        break;
      }
      case 'output_audio_buffer.started': {
        const reply = this.reply(e.response_id);
        reply.audio = true;
        if (reply.clientMs === undefined && this.turnStartedAt !== null) {
          reply.clientMs = Math.round(this.now() - this.turnStartedAt);
        }
        this.speakingResponseId = e.response_id;
        setState('speaking');
        break;
      }
      case 'output_audio_buffer.stopped':
      case 'output_audio_buffer.cleared':
        if (this.speakingResponseId === e.response_id || !e.response_id) {
          this.speakingResponseId = null;
        }
        // The reply's audio has ended (it comes before its response.done).
        if (this.state === 'speaking' && !this.speakingResponseId) setState('listening');
        break;
      case 'response.done':
        out.push(...this.responseDone(e.response ?? {}, setState));
        break;
      case 'error':
        out.push(['error', new VoiceAgentError(e.error?.code || 'server_error',
          e.error?.message || 'the server reported an error', { event: e })]);
        break;
      default:
        break;
    }
    return out;
  }

  reply(responseId) {
    let reply = this.replies.get(responseId);
    if (!reply) {
      reply = { text: '', audio: false, itemId: null };
      this.replies.set(responseId, reply);
    }
    return reply;
  }

  responseDone(response, setState) {
    const out = [];
    const reply = this.reply(response.id);
    this.replies.delete(response.id);
    if (this.activeResponseId === response.id) this.activeResponseId = null;
    const item = response.output?.[0];
    const final = item?.content?.[0]?.transcript;
    const text = typeof final === 'string' ? final : reply.text;
    out.push(['assistantdone', {
      responseId: response.id,
      itemId: item?.id ?? reply.itemId,
      text,
      status: response.status,
      reason: response.status_details?.reason ?? response.status_details?.error?.code,
    }]);
    const server = serverLatency(response.metadata);
    if (server || reply.clientMs !== undefined) {
      out.push(['latency', { responseId: response.id, server, clientMs: reply.clientMs }]);
    }
    if (response.status === 'failed') {
      const code = response.status_details?.error?.code || 'response_failed';
      out.push(['error', new VoiceAgentError(code, `the reply failed (${code})`)]);
    }
    // No audio is coming for this reply: hand the floor back.
    if (this.state === 'thinking' && !this.activeResponseId && !reply.audio) setState('listening');
    return out;
  }
}

