// Voice agent browser SDK: the microphone and ICE gathering, the two browser
// steps before an offer is sent. Part of voice-agent.js.

import { VoiceAgentError } from './voice-agent-errors.js';

const ICE_GATHER_TIMEOUT_MS = 2000;

export async function openMicrophone(microphone) {
  if (typeof MediaStream !== 'undefined' && microphone instanceof MediaStream) {
    return { stream: microphone, owned: false };
  }
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new VoiceAgentError('microphone_unavailable',
      'Microphone unavailable: the page must be served over HTTPS (or from localhost).', { fatal: true });
  }
  const constraints = {
    echoCancellation: true, noiseSuppression: true, autoGainControl: true, ...(microphone || {}),
  };
  try {
    return { stream: await navigator.mediaDevices.getUserMedia({ audio: constraints }), owned: true };
  } catch (err) {
    const name = err?.name;
    if (name === 'NotAllowedError' || name === 'SecurityError') {
      throw new VoiceAgentError('microphone_denied',
        'Microphone access was denied. Allow the microphone for this site and try again.', { fatal: true });
    }
    if (name === 'NotFoundError' || name === 'OverconstrainedError') {
      throw new VoiceAgentError('microphone_not_found', 'No microphone was found.', { fatal: true });
    }
    throw new VoiceAgentError('microphone_error',
      `The microphone could not be opened: ${err?.message || name}`, { fatal: true });
  }
}

export function iceGatheringComplete(pc) {
  if (pc.iceGatheringState === 'complete') return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      pc.removeEventListener('icegatheringstatechange', check);
      resolve();
    };
    const check = () => { if (pc.iceGatheringState === 'complete') done(); };
    // Host candidates arrive at once; don't wait long for STUN ones.
    const timer = setTimeout(done, ICE_GATHER_TIMEOUT_MS);
    pc.addEventListener('icegatheringstatechange', check);
  });
}
