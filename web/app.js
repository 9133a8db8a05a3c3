// Demo page, built on the same SDK other sites import from /sdk/voice-agent.js.

import { VoiceAgent } from '/sdk/voice-agent.js';

const $ = (id) => document.getElementById(id);
const ui = {
  button: $('connect'),
  mute: $('mute'),
  status: $('status'),
  error: $('error'),
  transcript: $('transcript'),
  audio: $('remote-audio'),
  inputLevel: $('input-level'),
  outputLevel: $('output-level'),
  textForm: $('text-form'),
  textInput: $('text-input'),
  microphone: $('microphone'),
  instructions: $('instructions'),
  voice: $('voice'),
  silence: $('silence'),
  apply: $('apply'),
  note: $('settings-note'),
};

// Inspected by automated browser tests.
const demo = (window.voiceAgent = { agent: null, events: [], state: 'disconnected', errors: [] });

let agent = null;
let meterTimer = null;
const userTurns = new Map(); // item_id -> bubble
const assistantTurns = new Map(); // response_id -> bubble

// ---- status, errors ------------------------------------------------------------

const STATE_LABELS = {
  connecting: 'connecting…', listening: 'listening', thinking: 'thinking…',
  speaking: 'speaking', disconnected: 'disconnected',
};

function showState(state) {
  demo.state = state;
  ui.status.dataset.state = state;
  ui.status.textContent = STATE_LABELS[state] ?? state;
  const live = state !== 'disconnected';
  ui.button.textContent = live ? 'Hang up' : 'Connect';
  ui.button.classList.toggle('hangup', live);
  ui.mute.hidden = ui.textForm.hidden = !live;
  if (!live) stopMeters();
}

function showError(err) {
  demo.errors.push({ code: err.code, message: err.message });
  ui.error.textContent = err.message;
  ui.error.dataset.code = err.code ?? '';
  ui.error.hidden = false;
}

function clearError() {
  ui.error.hidden = true;
  ui.error.textContent = '';
}

// ---- conversation view ----------------------------------------------------------

function addBubble(role, text) {
  const view = ui.transcript;
  const stick = view.scrollHeight - view.scrollTop - view.clientHeight < 40;
  const bubble = document.createElement('div');
  bubble.className = `turn ${role}`;
  const body = document.createElement('span');
  body.className = 'text';
  body.textContent = text;
  bubble.append(body);
  view.append(bubble);
  if (stick) bubble.scrollIntoView({ block: 'end' });
  return bubble;
}

const textOf = (bubble) => bubble.querySelector('.text');

function turnBubble(map, key, role, placeholder) {
  let bubble = map.get(key);
  if (!bubble) {
    bubble = addBubble(role, placeholder);
    bubble.classList.add('pending');
    map.set(key, bubble);
  }
  return bubble;
}

const userBubble = (itemId) => turnBubble(userTurns, itemId, 'user', '…');
const assistantBubble = (responseId) => turnBubble(assistantTurns, responseId, 'assistant', '');

function finishAssistant({ responseId, text, status }) {
  const bubble = assistantTurns.get(responseId);
  if (!bubble) return;
  bubble.classList.remove('pending');
  if (status === 'completed') return;
  if (!text.trim()) {
    bubble.remove(); // cancelled before a word was said: nothing to show
    return;
  }
  textOf(bubble).textContent = text; // what was actually heard
  const mark = document.createElement('span');
  mark.className = 'mark';
  mark.textContent = status === 'cancelled' ? ' (interrupted)' : ' (failed)';
  bubble.append(mark);
  bubble.classList.add(status === 'cancelled' ? 'interrupted' : 'failed');
}

function showLatency({ responseId, server, clientMs }) {
  const bubble = assistantTurns.get(responseId);
  if (!bubble || !bubble.isConnected) return;
  const parts = [];
  if (server?.voiceToVoiceMs !== undefined) {
    const spans = [['stt', server.sttMs], ['llm', server.llmTtftMs], ['tts', server.ttsFirstAudioMs]]
      .filter(([, v]) => v !== undefined)
      .map(([k, v]) => `${k} ${Math.round(v)}`);
    parts.push(`${Math.round(server.voiceToVoiceMs)} ms voice-to-voice`
      + (spans.length ? ` (${spans.join(' · ')} ms)` : ''));
  }
  if (clientMs !== undefined) parts.push(`client ${clientMs} ms`);
  if (!parts.length) return;
  const note = document.createElement('div');
  note.className = 'latency';
  note.textContent = parts.join(' · ');
  bubble.after(note);
}

// ---- meters ------------------------------------------------------------------------

function setLevel(bar, level) {
  // Perceptual scale: audioLevel is linear amplitude.
  const pct = Math.min(100, Math.round(Math.sqrt(level) * 100));
  bar.style.width = `${pct}%`;
}

function startMeters() {
  stopMeters();
  meterTimer = setInterval(async () => {
    if (!agent) return;
    const { input, output } = await agent.getLevels();
    setLevel(ui.inputLevel, input);
    setLevel(ui.outputLevel, output);
  }, 100);
}

function stopMeters() {
  clearInterval(meterTimer);
  meterTimer = null;
  setLevel(ui.inputLevel, 0);
  setLevel(ui.outputLevel, 0);
}

// ---- microphones and settings --------------------------------------------------------

async function listMicrophones() {
  if (!navigator.mediaDevices?.enumerateDevices) return;
  const devices = (await navigator.mediaDevices.enumerateDevices()).filter((d) => d.kind === 'audioinput');
  const chosen = ui.microphone.value;
  const options = [new Option('Default microphone', '')];
  devices.forEach((d, i) => {
    if (d.deviceId && d.deviceId !== 'default') options.push(new Option(d.label || `Microphone ${i + 1}`, d.deviceId));
  });
  ui.microphone.replaceChildren(...options);
  ui.microphone.value = options.some((o) => o.value === chosen) ? chosen : '';
}

// The voices the server has (GET /v1/voices), offered in the settings.
async function listVoices() {
  const data = await new VoiceAgent().voices();
  const chosen = ui.voice.value;
  const options = [new Option('Server default', '')];
  for (const v of data) {
    options.push(new Option(v.default ? `${v.name} (default, ${v.backend})` : `${v.name} (${v.backend})`, v.name));
  }
  ui.voice.replaceChildren(...options);
  ui.voice.value = options.some((o) => o.value === chosen) ? chosen : '';
}

function settingsFromForm() {
  const settings = {};
  if (ui.instructions.value.trim()) settings.instructions = ui.instructions.value.trim();
  if (ui.voice.value) settings.voice = ui.voice.value;
  if (ui.silence.value) settings.turnDetection = { silenceDurationMs: Number(ui.silence.value) };
  return settings;
}

function showSession(session) {
  const voice = session?.audio?.output?.voice;
  if (!ui.instructions.value) ui.instructions.placeholder = session?.instructions ?? 'Server default';
  if (voice) ui.voice.options[0].textContent = `Server default (${voice})`;
  const silence = session?.audio?.input?.turn_detection?.silence_duration_ms;
  if (!ui.silence.value && silence) ui.silence.placeholder = String(silence);
}

async function applySettings() {
  const wanted = settingsFromForm();
  if (!agent || agent.state === 'disconnected' || !Object.keys(wanted).length) {
    ui.note.textContent = agent ? 'Nothing to change.' : 'Settings apply to the next call.';
    return;
  }
  try {
    // A voice the server does not have is refused, with the ones it has named.
    await agent.updateSession(wanted);
    ui.note.textContent = 'Applied.';
  } catch (err) {
    ui.note.textContent = `Not applied: ${err.message}`;
  }
}

// ---- connection ---------------------------------------------------------------------

function subscribe(a) {
  a.on('event', (e) => demo.events.push(e));
  a.on('state', ({ state }) => { if (a === agent) showState(state); });
  a.on('session', ({ session }) => showSession(session));
  a.on('speechstart', ({ itemId }) => userBubble(itemId));
  a.on('userpartial', ({ itemId, text }) => { textOf(userBubble(itemId)).textContent = text; });
  a.on('usertranscript', ({ itemId, text }) => {
    const bubble = userBubble(itemId);
    if (!text) { bubble.remove(); return; } // noise, not words
    textOf(bubble).textContent = text;
    bubble.classList.remove('pending');
  });
  a.on('responsestart', ({ responseId }) => assistantBubble(responseId));
  a.on('assistantdelta', ({ responseId, text }) => { textOf(assistantBubble(responseId)).textContent = text; });
  a.on('assistantdone', finishAssistant);
  a.on('latency', showLatency);
  a.on('error', showError);
}

async function connect() {
  clearError();
  userTurns.clear();
  assistantTurns.clear();
  ui.transcript.replaceChildren();
  demo.events.length = 0;
  const deviceId = ui.microphone.value;
  agent = demo.agent = new VoiceAgent({
    audio: ui.audio,
    microphone: deviceId ? { deviceId: { exact: deviceId } } : undefined,
  });
  subscribe(agent);
  agent.unmute();
  ui.mute.textContent = 'Mute';
  ui.mute.setAttribute('aria-pressed', 'false');
  const current = agent;
  try {
    await current.connect();
  } catch {
    return; // shown through the `error` event
  }
  if (current !== agent) return;
  startMeters();
  listMicrophones().catch(() => {}); // labels are readable now that access was granted
  if (ui.voice.options.length === 1) listVoices().catch(() => {}); // loading at page load
  if (Object.keys(settingsFromForm()).length) applySettings();
}

function hangUp() {
  const current = agent;
  agent = null;
  current?.disconnect();
  showState('disconnected');
}

ui.button.addEventListener('click', () => (agent && agent.state !== 'disconnected' ? hangUp() : connect()));
ui.mute.addEventListener('click', () => {
  if (!agent) return;
  const muting = !agent.muted;
  if (muting) agent.mute(); else agent.unmute();
  ui.mute.textContent = muting ? 'Unmute' : 'Mute';
  ui.mute.setAttribute('aria-pressed', String(muting));
});
ui.textForm.addEventListener('submit', (e) => {
  e.preventDefault();
  const text = ui.textInput.value.trim();
  if (!text || !agent) return;
  try {
    agent.sendText(text);
    const bubble = addBubble('user', text);
    bubble.classList.add('typed');
    ui.textInput.value = '';
  } catch (err) {
    showError(err);
  }
});
ui.apply.addEventListener('click', applySettings);
listVoices().catch(() => {}); // the picker keeps its "Server default" alone
navigator.mediaDevices?.addEventListener?.('devicechange', () => listMicrophones().catch(() => {}));
listMicrophones().catch(() => {});
window.addEventListener('pagehide', () => hangUp());
showState('disconnected');
