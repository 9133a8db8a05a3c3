// Demo client for the self-hosted voice agent (OpenAI Realtime WebRTC shape).
// Plain ES module, no dependencies.

const CALLS_URL = '/v1/realtime/calls';
const ICE_GATHER_TIMEOUT_MS = 2000;

const ui = {
  button: document.getElementById('connect'),
  status: document.getElementById('status'),
  transcript: document.getElementById('transcript'),
  audio: document.getElementById('remote-audio'),
};

// Inspected by automated browser tests.
const agent = (window.voiceAgent = { pc: null, channel: null, events: [], state: 'idle' });

let call = null; // the current call: { pc, mic, location, closed }
const userTurns = new Map(); // item_id -> bubble
const assistantTurns = new Map(); // response_id -> bubble

// ---- status line ------------------------------------------------------------

function setStatus(state, message) {
  agent.state = state;
  ui.status.dataset.state = state;
  ui.status.textContent = message ? `${state}: ${message}` : state;
}

function setButton(connected) {
  ui.button.textContent = connected ? 'Hang up' : 'Connect';
  ui.button.classList.toggle('hangup', connected);
}

// ---- transcript ---------------------------------------------------------------

function addBubble(role, text) {
  const stick = ui.transcript.scrollHeight - ui.transcript.scrollTop - ui.transcript.clientHeight < 40;
  const bubble = document.createElement('div');
  bubble.className = `turn ${role}`;
  const body = document.createElement('span');
  body.className = 'text';
  body.textContent = text;
  bubble.append(body);
  ui.transcript.append(bubble);
  if (stick) bubble.scrollIntoView({ block: 'end' });
  return bubble;
}

const textOf = (bubble) => bubble.querySelector('.text');

function userBubble(itemId) {
  let bubble = userTurns.get(itemId);
  if (!bubble) {
    bubble = addBubble('user', '…');
    bubble.classList.add('pending');
    userTurns.set(itemId, bubble);
  }
  return bubble;
}

function assistantBubble(responseId) {
  let bubble = assistantTurns.get(responseId);
  if (!bubble) {
    bubble = addBubble('assistant', '');
    bubble.classList.add('pending');
    assistantTurns.set(responseId, bubble);
  }
  return bubble;
}

function finishAssistant(response) {
  const bubble = assistantTurns.get(response.id);
  if (!bubble) return;
  bubble.classList.remove('pending');
  if (response.status !== 'completed') {
    if (!textOf(bubble).textContent.trim()) {
      bubble.remove(); // cancelled before a word was said: nothing to show
      return;
    }
    const mark = document.createElement('span');
    mark.className = 'mark';
    mark.textContent = response.status === 'cancelled' ? ' (interrupted)' : ' (failed)';
    bubble.append(mark);
    bubble.classList.add(response.status === 'cancelled' ? 'interrupted' : 'failed');
  }
  const m = response.metadata || {};
  if (m.voice_to_voice_ms) {
    const parts = [['stt', m.stt_ms], ['llm', m.llm_ttft_ms], ['tts', m.tts_first_audio_ms]]
      .filter(([, v]) => v)
      .map(([k, v]) => `${k} ${Math.round(Number(v))}`);
    const note = document.createElement('div');
    note.className = 'latency';
    note.textContent = `${Math.round(Number(m.voice_to_voice_ms))} ms voice-to-voice`
      + (parts.length ? ` (${parts.join(' · ')} ms)` : '');
    bubble.after(note);
  }
}

// ---- server events -------------------------------------------------------------

const handlers = {
  'session.created': () => setStatus('listening'),
  'input_audio_buffer.speech_started': (e) => {
    userBubble(e.item_id);
    setStatus('user speaking');
  },
  'input_audio_buffer.speech_stopped': () => setStatus('thinking'),
  'conversation.item.input_audio_transcription.completed': (e) => {
    const bubble = userBubble(e.item_id);
    const text = (e.transcript || '').trim();
    if (!text) { bubble.remove(); return; } // noise, not words
    textOf(bubble).textContent = text;
    bubble.classList.remove('pending');
  },
  'response.created': (e) => {
    assistantBubble(e.response.id);
    if (agent.state === 'listening') setStatus('thinking');
  },
  'response.output_audio_transcript.delta': (e) => {
    textOf(assistantBubble(e.response_id)).textContent += e.delta;
  },
  'response.output_audio_transcript.done': (e) => {
    const bubble = assistantTurns.get(e.response_id);
    if (bubble && typeof e.transcript === 'string') textOf(bubble).textContent = e.transcript;
  },
  'output_audio_buffer.started': () => setStatus('speaking'),
  'output_audio_buffer.stopped': () => { if (agent.state === 'speaking') setStatus('listening'); },
  'output_audio_buffer.cleared': () => { if (agent.state === 'speaking') setStatus('listening'); },
  'response.done': (e) => {
    finishAssistant(e.response);
    if (e.response.status !== 'completed' && agent.state === 'thinking') setStatus('listening');
  },
  error: (e) => setStatus('error', e.error?.message || e.error?.code || 'unknown error'),
};

function onMessage(msg) {
  let event;
  try { event = JSON.parse(msg.data); } catch { return; }
  agent.events.push(event);
  handlers[event.type]?.(event);
}

// ---- connection --------------------------------------------------------------------

async function openMicrophone() {
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new Error('microphone unavailable (the page needs HTTPS or localhost)');
  }
  try {
    return await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
  } catch (err) {
    if (err.name === 'NotAllowedError') throw new Error('microphone access denied');
    if (err.name === 'NotFoundError') throw new Error('no microphone found');
    throw new Error(`microphone error: ${err.message || err.name}`);
  }
}

function iceGatheringComplete(pc) {
  if (pc.iceGatheringState === 'complete') return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => { clearTimeout(timer); pc.removeEventListener('icegatheringstatechange', check); resolve(); };
    const check = () => { if (pc.iceGatheringState === 'complete') done(); };
    const timer = setTimeout(done, ICE_GATHER_TIMEOUT_MS);
    pc.addEventListener('icegatheringstatechange', check);
  });
}

async function describeRefusal(res) {
  let code = '';
  let message = `${res.status} ${res.statusText}`.trim();
  try {
    const body = await res.json();
    code = body.error?.code || '';
    message = body.error?.message || message;
  } catch { /* not JSON */ }
  const retry = res.headers.get('Retry-After');
  const label = { server_full: 'server full', not_ready: 'server starting' }[code] || `call refused (${res.status})`;
  return `${label}: ${message}${retry ? ` — retry in ${retry} s` : ''}`;
}

function release(c) {
  c.closed = true;
  c.mic?.getTracks().forEach((t) => t.stop());
  c.pc?.close();
  if (c.location) fetch(c.location, { method: 'DELETE', keepalive: true }).catch(() => {});
  c.location = null;
}

function hangUp(state = 'disconnected', message) {
  if (!call) return;
  release(call);
  call = null;
  agent.pc = agent.channel = null;
  ui.audio.srcObject = null;
  setButton(false);
  setStatus(state, message);
}

async function connect() {
  const c = (call = { pc: null, mic: null, location: null, closed: false });
  agent.events.length = 0;
  userTurns.clear();
  assistantTurns.clear();
  ui.transcript.replaceChildren();
  setButton(true);
  setStatus('connecting');
  try {
    c.mic = await openMicrophone();
    if (c.closed) return release(c);

    const pc = (c.pc = agent.pc = new RTCPeerConnection({ iceServers: [] }));
    const [track] = c.mic.getAudioTracks();
    pc.addTransceiver(track, { direction: 'sendrecv', streams: [c.mic] });
    pc.ontrack = (e) => {
      ui.audio.srcObject = e.streams[0] || new MediaStream([e.track]);
      ui.audio.play().catch(() => {});
    };
    pc.onconnectionstatechange = () => {
      if (call === c && pc.connectionState === 'failed') hangUp('error', 'connection failed');
    };
    const channel = (agent.channel = pc.createDataChannel('oai-events'));
    channel.onmessage = onMessage;
    channel.onclose = () => { if (call === c) hangUp('disconnected', 'call ended by the server'); };

    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringComplete(pc);
    if (c.closed) return release(c);

    const res = await fetch(CALLS_URL, {
      method: 'POST',
      headers: { 'Content-Type': 'application/sdp' },
      body: pc.localDescription.sdp,
    }).catch(() => { throw new Error('server unreachable'); });
    if (res.status !== 201) throw new Error(await describeRefusal(res));
    c.location = res.headers.get('Location');
    const sdp = await res.text();
    if (c.closed) return release(c);
    await pc.setRemoteDescription({ type: 'answer', sdp });
  } catch (err) {
    if (call === c) hangUp('error', err.message || String(err));
    else release(c);
  }
}

ui.button.addEventListener('click', () => (call ? hangUp() : connect()));
window.addEventListener('pagehide', () => hangUp());
