// Voice agent browser SDK: ES modules, no dependencies, no build step.
//
//   import { connect } from 'https://voice.example/sdk/voice-agent.js';
//   const agent = await connect({ url: 'https://voice.example', on: {
//     usertranscript: (e) => console.log('you:', e.text),
//     assistantdone: (e) => console.log('agent:', e.text),
//   } });
//
// The wire format is OpenAI's Realtime WebRTC shape (SDP offer POSTed to
// /v1/realtime/calls, JSON events on the `oai-events` data channel), so every
// raw server event is also available through the `event` callback.
// Types: voice-agent.d.ts, served beside this file.
//
// This module is the agent (the call, its media and events); beside it, and
// imported by it: voice-agent-events.js (the events both ways),
// voice-agent-media.js (microphone, ICE) and voice-agent-errors.js.

import { VoiceAgentError, refusal } from './voice-agent-errors.js';
import { EventTracker, eventId, sessionUpdateEvent, userTextEvents } from './voice-agent-events.js';
import { iceGatheringComplete, openMicrophone } from './voice-agent-media.js';

export { VoiceAgentError } from './voice-agent-errors.js';
export { EventTracker, serverLatency, sessionUpdateEvent, userTextEvents } from './voice-agent-events.js';

export const CALLS_PATH = '/v1/realtime/calls';
const DEFAULT_CONNECT_TIMEOUT_MS = 15000;

/** @type {readonly string[]} */
export const STATES = ['connecting', 'listening', 'thinking', 'speaking', 'disconnected'];

export class VoiceAgent {
  /** @param {import('./voice-agent').ConnectOptions} options */
  constructor(options = {}) {
    this.options = { ...options };
    this.base = new URL(options.url ?? '', globalThis.location?.href).href.replace(/\/+$/, '');
    this.listeners = new Map();
    this.tracker = new EventTracker(undefined, 'disconnected');
    this.pc = null;
    this.channel = null;
    this.microphone = null; // the MediaStream sent to the server
    this.remoteStream = null;
    this.audio = null;
    this.callUrl = null;
    this.muted = false;
    this.events = []; // every server event received, oldest first
    this.attempt = null; // the connection attempt in progress (cancel token)
    this.closing = false;
    this.pending = new Map(); // client event_id -> { resolve, reject } (updateSession)
    for (const [type, fn] of Object.entries(options.on ?? {})) this.on(type, fn);
  }

  get state() { return this.tracker.state; }

  /** Subscribe to a typed event; returns the unsubscribe function. */
  on(type, fn) {
    if (!this.listeners.has(type)) this.listeners.set(type, new Set());
    this.listeners.get(type).add(fn);
    return () => this.off(type, fn);
  }

  off(type, fn) { this.listeners.get(type)?.delete(fn); }

  emit(type, detail) {
    for (const fn of [...(this.listeners.get(type) ?? [])]) {
      try { fn(detail); } catch (err) { console.error(`voice-agent ${type} listener failed`, err); }
    }
  }

  setState(state) {
    if (state === this.tracker.state) return;
    const previous = this.tracker.state;
    this.tracker.state = state;
    this.emit('state', { state, previous });
  }

  /** Connect; resolves once the call is up and the server's audio flows. */
  async connect() {
    if (this.attempt || this.pc) throw new VoiceAgentError('already_connected', 'already connected');
    const reconnect = this.options.reconnect;
    const attempts = reconnect ? (reconnect === true ? 3 : reconnect.attempts ?? 3) : 0;
    for (let tries = 0; ; tries += 1) {
      try {
        return await this.connectOnce();
      } catch (err) {
        const retryable = err?.code === 'server_full' || err?.code === 'server_unreachable'
          || err?.code === 'ice_failed' || err?.code === 'not_ready';
        if (this.closing || !retryable || tries >= attempts) throw err;
        this.emit('reconnecting', { attempt: tries + 1, error: err });
        if (!(await this.pause(err.retryAfter !== undefined ? err.retryAfter * 1000 : this.retryDelay()))) throw err;
      }
    }
  }

  retryDelay() {
    const r = this.options.reconnect;
    return typeof r === 'object' && r.delayMs !== undefined ? r.delayMs : 1000;
  }

  pause(ms) {
    return new Promise((resolve) => {
      const timer = setTimeout(() => { this.wake = null; resolve(!this.closing); }, ms);
      this.wake = () => { clearTimeout(timer); this.wake = null; resolve(false); };
    });
  }

  async connectOnce() {
    const attempt = (this.attempt = { cancelled: false, phase: 'microphone', abort: new AbortController() });
    this.closing = false;
    this.tracker = new EventTracker(undefined, this.tracker.state);
    this.setState('connecting');
    const timeoutMs = this.options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
    let timer;
    try {
      // Not timed: the user may take a while to answer the permission prompt.
      await this.acquireMicrophone(attempt);
      const timeout = new Promise((_, reject) => {
        timer = setTimeout(() => reject(this.timeoutError(attempt, timeoutMs)), timeoutMs);
      });
      await Promise.race([this.establish(attempt), timeout]);
      return this;
    } catch (err) {
      const error = err instanceof VoiceAgentError ? err
        : new VoiceAgentError('connect_failed', `Could not connect: ${err?.message || err}`, { fatal: true });
      const report = !attempt.cancelled;
      attempt.cancelled = true; // a still-running establish() stops at its next step
      attempt.abort.abort(); // and an offer in flight is not left hanging
      this.release();
      if (report) {
        this.emit('error', error);
        this.setState('disconnected');
      }
      throw error;
    } finally {
      clearTimeout(timer);
      if (this.attempt === attempt) this.attempt = null;
    }
  }

  checkCancelled(attempt) {
    if (attempt.cancelled) throw new VoiceAgentError('cancelled', 'disconnected while connecting');
  }

  timeoutError(attempt, timeoutMs) {
    const s = timeoutMs / 1000;
    if (attempt.phase === 'ice' && this.pc?.iceConnectionState !== 'connected') {
      return new VoiceAgentError('ice_failed',
        `No network path to the server's media within ${s} s (a firewall may block UDP; a TURN server helps).`,
        { fatal: true });
    }
    const what = attempt.phase === 'signaling' ? 'The server did not answer' : 'No audio from the server';
    return new VoiceAgentError('timeout', `${what} within ${s} s.`, { fatal: true });
  }

  async acquireMicrophone(attempt) {
    const mic = await openMicrophone(this.options.microphone);
    this.microphone = mic.stream;
    this.ownsMicrophone = mic.owned;
    this.checkCancelled(attempt);
    const track = mic.stream.getAudioTracks()[0];
    if (!track) throw new VoiceAgentError('microphone_not_found', 'The stream has no audio track.', { fatal: true });
    track.enabled = !this.muted;
  }

  async establish(attempt) {
    attempt.phase = 'signaling';
    const track = this.microphone.getAudioTracks()[0];

    const pc = (this.pc = new RTCPeerConnection({ iceServers: this.options.iceServers ?? [] }));
    pc.addTransceiver(track, { direction: 'sendrecv', streams: [this.microphone] });
    const gotAudio = new Promise((resolve) => {
      pc.ontrack = (e) => {
        this.remoteStream = e.streams[0] || new MediaStream([e.track]);
        this.play();
        // A remote track starts muted and unmutes at its first RTP packet.
        if (!e.track.muted) resolve();
        else e.track.addEventListener('unmute', () => resolve(), { once: true });
      };
    });
    const connected = new Promise((resolve, reject) => {
      pc.onconnectionstatechange = () => {
        if (pc.connectionState === 'connected') {
          attempt.phase = 'media';
          resolve();
        }
        if (pc.connectionState === 'failed') {
          const err = new VoiceAgentError('ice_failed',
            'The network connection to the server failed (ICE).', { fatal: true });
          if (this.attempt === attempt) reject(err);
          else if (this.pc === pc) this.lost(err);
        }
      };
    });
    connected.catch(() => {}); // awaited below; this only marks it handled meanwhile
    const channel = (this.channel = pc.createDataChannel('oai-events'));
    const sessionCreated = new Promise((resolve) => {
      channel.onmessage = (msg) => {
        const event = this.receive(msg.data);
        if (event?.type === 'session.created') resolve();
      };
    });
    let channelClosed;
    const closedWhileConnecting = new Promise((_, reject) => { channelClosed = reject; });
    closedWhileConnecting.catch(() => {}); // raced below; this only marks it handled meanwhile
    channel.onclose = () => {
      if (this.pc !== pc || this.closing) return;
      const err = new VoiceAgentError('call_ended', 'The server ended the call.', { fatal: true });
      // While connecting, the attempt fails (connect() rejects at once);
      // lost() is for a call that was up.
      if (this.attempt === attempt) channelClosed(err);
      else this.lost(err);
    };

    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringComplete(pc);
    this.checkCancelled(attempt);

    const headers = { 'Content-Type': 'application/sdp' };
    if (this.options.token) headers.Authorization = `Bearer ${this.options.token}`;
    let res;
    try {
      res = await fetch(this.base + CALLS_PATH, {
        method: 'POST', headers, body: pc.localDescription.sdp, signal: attempt.abort.signal,
      });
    } catch {
      throw new VoiceAgentError('server_unreachable',
        `The voice server at ${this.base} could not be reached.`, { fatal: true });
    }
    if (res.status !== 201) throw await refusal(res);
    const location = res.headers.get('Location');
    this.callUrl = location ? new URL(location, this.base + '/').href : null;
    const sdp = await res.text();
    this.checkCancelled(attempt);
    await pc.setRemoteDescription({ type: 'answer', sdp });
    attempt.phase = 'ice';
    await Promise.race([Promise.all([connected, sessionCreated, gotAudio]), closedWhileConnecting]);
    this.checkCancelled(attempt);
    this.connectedAt = performance.now();
  }

  play() {
    if (this.options.audio === null) return; // the app plays remoteStream itself
    if (!this.audio) {
      this.audio = this.options.audio ?? new Audio();
      this.audio.autoplay = true;
    }
    this.audio.srcObject = this.remoteStream;
    this.audio.play?.().catch(() => {
      this.emit('error', new VoiceAgentError('autoplay_blocked',
        'The browser blocked audio playback: call connect() from a click or tap.'));
    });
  }

  receive(data) {
    let event;
    try { event = JSON.parse(data); } catch { return null; }
    this.events.push(event);
    this.emit('event', event);
    for (const [type, detail] of this.tracker.handle(event)) this.emit(type, detail);
    const waiter = event.type === 'error' ? this.pending.get(event.error?.event_id) : null;
    if (waiter) waiter.reject(new VoiceAgentError(event.error.code, event.error.message, { event }));
    if (event.type === 'session.updated') {
      for (const w of this.pending.values()) w.resolve(event.session);
    }
    return event;
  }

  /** An established call was lost: report it, release everything, maybe reconnect. */
  lost(error) {
    if (error.code === 'call_ended') this.callUrl = null; // already gone on the server
    this.emit('error', error);
    this.release();
    this.setState('disconnected');
    if (this.options.reconnect && !this.closing) {
      this.emit('reconnecting', { attempt: 1, error });
      this.connect().catch(() => { /* reported through `error` */ });
    }
  }

  send(event) {
    if (!this.channel || this.channel.readyState !== 'open') {
      throw new VoiceAgentError('not_connected', 'Not connected.');
    }
    this.channel.send(JSON.stringify(event));
  }

  mute() {
    this.muted = true;
    this.microphone?.getAudioTracks().forEach((t) => { t.enabled = false; });
  }

  unmute() {
    this.muted = false;
    this.microphone?.getAudioTracks().forEach((t) => { t.enabled = true; });
  }

  /** Stop the assistant: cancel the reply being generated and the audio being played. */
  interrupt() {
    if (this.tracker.activeResponseId) this.send({ type: 'response.cancel', event_id: eventId() });
    if (this.tracker.speakingResponseId || this.tracker.state === 'speaking') {
      this.send({ type: 'output_audio_buffer.clear', event_id: eventId() });
    }
  }

  /** The voices the server has (GET /v1/voices), the default first; needs no call. */
  async voices() {
    let res;
    try {
      res = await fetch(`${this.base}/v1/voices`);
    } catch {
      throw new VoiceAgentError('server_unreachable', `The voice server at ${this.base} could not be reached.`);
    }
    if (!res.ok) {
      const error = await refusal(res);
      throw new VoiceAgentError(error.code, error.message, { status: res.status, retryAfter: error.retryAfter });
    }
    return (await res.json()).data;
  }

  /** Change instructions, voice or turn detection; resolves with the updated session. */
  updateSession(options) {
    const event = sessionUpdateEvent(options);
    return new Promise((resolve, reject) => {
      const settle = (fn) => (value) => { this.pending.delete(event.event_id); fn(value); };
      this.pending.set(event.event_id, { resolve: settle(resolve), reject: settle(reject) });
      try { this.send(event); } catch (err) { this.pending.delete(event.event_id); reject(err); }
    });
  }

  /** Send a typed user message and ask for a reply (cancelling the reply in progress, if any). */
  sendText(text) {
    const events = userTextEvents(text);
    // The server refuses a second response.create while a reply is active:
    // a typed message interrupts that reply, as speaking over it would.
    if (this.tracker.activeResponseId) this.send({ type: 'response.cancel', event_id: eventId() });
    for (const event of events) this.send(event);
    this.tracker.textSent();
  }

  /** Microphone and assistant audio levels, 0..1, from the peer connection's stats. */
  async getLevels() {
    const levels = { input: 0, output: 0 };
    if (!this.pc) return levels;
    const stats = await this.pc.getStats();
    stats.forEach((s) => {
      if (s.type === 'media-source' && s.kind === 'audio' && s.audioLevel !== undefined) levels.input = s.audioLevel;
      if (s.type === 'inbound-rtp' && s.kind === 'audio' && s.audioLevel !== undefined) levels.output = s.audioLevel;
    });
    if (this.muted) levels.input = 0;
    return levels;
  }

  release() {
    const { pc, channel } = this;
    this.pc = null;
    this.channel = null;
    for (const waiter of this.pending.values()) waiter.reject(new VoiceAgentError('not_connected', 'Disconnected.'));
    this.pending.clear();
    if (this.ownsMicrophone) this.microphone?.getTracks().forEach((t) => t.stop());
    this.microphone = null;
    if (this.audio) this.audio.srcObject = null;
    this.remoteStream = null;
    if (pc) {
      pc.ontrack = pc.onconnectionstatechange = null;
      if (channel) channel.onmessage = channel.onclose = null;
    }
    if (this.callUrl) {
      // Hang up with DELETE first: closing the peer first would end the call
      // on the server already, and the DELETE would then be a (logged) 404.
      // The microphone is stopped above, so nothing more is sent meanwhile.
      const headers = this.options.token ? { Authorization: `Bearer ${this.options.token}` } : {};
      const close = () => pc?.close();
      fetch(this.callUrl, { method: 'DELETE', headers, keepalive: true }).then(close, close);
      setTimeout(close, 1000); // a server that is slow to answer does not keep the peer open
      this.callUrl = null;
    } else {
      pc?.close();
    }
  }

  /** Hang up and release the microphone, the peer connection and the call. */
  disconnect() {
    this.closing = true;
    this.wake?.();
    if (this.attempt) {
      this.attempt.cancelled = true;
      this.attempt.abort.abort();
    }
    const wasConnected = this.pc !== null || this.attempt !== null;
    this.release();
    if (wasConnected || this.state !== 'disconnected') this.setState('disconnected');
  }
}

/** Create an agent and connect it. Pass `on` handlers to see events from the start. */
export async function connect(options) {
  const agent = new VoiceAgent(options);
  await agent.connect();
  return agent;
}
