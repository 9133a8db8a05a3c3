// A minimal page script: a button that starts and ends a call to the voice
// agent, and the agent's state and words as they come. The SDK comes from
// the npm package (web/ in the service's repository, `npm pack`-ed), not
// from the server; bundle it with any bundler (`npm run build` uses esbuild).
import { connect, STATES, VoiceAgentError } from 'voice-agent-sdk';

const button = document.querySelector('#call');
const state = document.querySelector('#state');
const said = document.querySelector('#said');
let agent = null;

button.addEventListener('click', async () => {
  if (agent) {
    agent.disconnect();
    agent = null;
    button.textContent = 'Call';
    return;
  }
  try {
    // The app's own backend mints a short-lived client secret with its API
    // key (POST /v1/realtime/client_secrets) and hands the page only that.
    const { value } = await (await fetch('/client-secret', { method: 'POST' })).json();
    agent = await connect({ url: window.VOICE_AGENT_URL, token: value });
  } catch (error) {
    state.textContent = error instanceof VoiceAgentError ? `${error.code}: ${error.message}` : String(error);
    return;
  }
  button.textContent = 'Hang up';
  agent.on('state', ({ state: now }) => {
    state.textContent = STATES.includes(now) ? now : 'unknown';
  });
  agent.on('usertranscript', ({ text }) => {
    said.textContent = text;
  });
});
