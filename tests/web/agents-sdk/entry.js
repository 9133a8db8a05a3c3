// The parts of OpenAI's @openai/agents-realtime SDK the browser test uses,
// bundled as one ES module by tests/web/test_agents_sdk.py (esbuild, offline).
export { OpenAIRealtimeWebRTC, RealtimeAgent, RealtimeSession } from '@openai/agents-realtime';
