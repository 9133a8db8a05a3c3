// Voice agent browser SDK: its error type, and what a refused call becomes.
// Part of voice-agent.js (which re-exports VoiceAgentError); no dependencies.

export class VoiceAgentError extends Error {
  /**
   * @param {string} code  machine-readable reason (see voice-agent.d.ts)
   * @param {string} message  readable text, fit to show a user
   * @param {{status?: number, retryAfter?: number, fatal?: boolean, event?: object}} [extra]
   */
  constructor(code, message, extra = {}) {
    super(message);
    this.name = 'VoiceAgentError';
    this.code = code;
    this.status = extra.status;
    this.retryAfter = extra.retryAfter;
    this.fatal = extra.fatal ?? false;
    this.event = extra.event;
  }
}

/** A refused call's HTTP response as the error a page shows (its code, Retry-After). */
export async function refusal(res) {
  let code = '';
  let message = `${res.status} ${res.statusText}`.trim();
  try {
    const body = await res.json();
    code = body?.error?.code || '';
    message = body?.error?.message || message;
  } catch { /* not JSON */ }
  const header = res.headers.get('Retry-After');
  const retryAfter = header !== null && /^\d+$/.test(header.trim()) ? Number(header) : undefined;
  const retry = retryAfter !== undefined ? ` Try again in ${retryAfter} s.` : '';
  if (res.status === 503 && code === 'server_full') {
    return new VoiceAgentError('server_full', `The server is full: ${message}.${retry}`,
      { status: 503, retryAfter, fatal: true });
  }
  if (res.status === 503) {
    return new VoiceAgentError(code || 'server_unavailable', `The server is not available: ${message}.${retry}`,
      { status: 503, retryAfter, fatal: true });
  }
  return new VoiceAgentError(code || 'call_refused', `The call was refused (${res.status}): ${message}`,
    { status: res.status, retryAfter, fatal: true });
}
